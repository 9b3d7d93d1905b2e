#include "worker/data/char_dataset.h"

#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/char_vocab.h"
#include "worker/data/synthetic_source.h"
#include "worker/data/text_entropy.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

constexpr char kShakespeare[] = "/work/shared/data/tinyshakespeare.txt";

// A file under the test's temp dir, removed when the test ends.
class TempFile {
 public:
  explicit TempFile(const std::string& contents)
      : path_(std::filesystem::path(::testing::TempDir()) /
              ("char_dataset_test_" + std::to_string(::getpid()) + "_" +
               std::to_string(counter_++) + ".txt")) {
    std::ofstream(path_, std::ios::binary) << contents;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

// Entropy by plain counting, independent of text_entropy.cc.
double CountedEntropyBits(const std::string& text) {
  std::array<double, 256> counts{};
  for (unsigned char c : text) counts[c] += 1;
  double h = 0;
  for (double n : counts) {
    if (n > 0) h -= n / text.size() * std::log2(n / text.size());
  }
  return h;
}

TEST(CharVocabTest, SortedDistinctBytesAndRoundTrip) {
  const CharVocab vocab = CharVocab::FromText("hello world\n");
  EXPECT_EQ(vocab.size(), 9);
  EXPECT_EQ(vocab.chars(), "\n dehlorw");
  EXPECT_EQ(vocab.Id('\n'), 0);
  EXPECT_EQ(vocab.Id('w'), 8);
  EXPECT_EQ(vocab.Id('z'), -1);
  ZO_ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, vocab.Encode("world hello"));
  EXPECT_THAT(ids, ::testing::ElementsAre(8, 6, 7, 5, 2, 1, 4, 3, 5, 5, 6));
  ZO_ASSERT_OK_AND_ASSIGN(std::string text, vocab.Decode(ids));
  EXPECT_EQ(text, "world hello");
}

TEST(CharVocabTest, RejectsUnknownBytesAndIds) {
  const CharVocab vocab = CharVocab::FromText("abc");
  EXPECT_THAT(vocab.Encode("abz"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("offset 2")));
  EXPECT_THAT(vocab.Decode(std::vector<int32_t>{0, 3}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("id 3 at index 1")));
  EXPECT_THAT(vocab.Decode(std::vector<int32_t>{-1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("id -1")));
}

// Enough text that random windows rarely coincide; CharBatch::starts says
// where each came from, so checks compare against the text directly.
std::string DistinctText() { return SyntheticText(20000, 7); }

TEST(CharDatasetTest, TargetsAreTheNextCharacterInTheText) {
  const std::string text = DistinctText();
  ZO_ASSERT_OK_AND_ASSIGN(CharDataset data, CharDataset::FromText(text));
  ZO_ASSERT_OK_AND_ASSIGN(CharBatch b, data.Sample(8, 32, 5, 0, 1));
  ASSERT_EQ(b.tokens.size(), 8u * 32u);
  ASSERT_EQ(b.targets.size(), 8u * 32u);
  ASSERT_EQ(b.starts.size(), 8u);
  for (int r = 0; r < 8; ++r) {
    const int64_t s = b.starts[r];
    ASSERT_GE(s, 0);
    ASSERT_LE(s + 32 + 1, static_cast<int64_t>(text.size()));
    for (int t = 0; t < 32; ++t) {
      EXPECT_EQ(data.vocab().Char(b.tokens[r * 32 + t]), text[s + t]);
      EXPECT_EQ(data.vocab().Char(b.targets[r * 32 + t]), text[s + t + 1]);
      if (t + 1 < 32) {
        EXPECT_EQ(b.targets[r * 32 + t], b.tokens[r * 32 + t + 1]);
      }
    }
  }
}

TEST(CharDatasetTest, SameArgumentsGiveTheSameBatch) {
  ZO_ASSERT_OK_AND_ASSIGN(CharDataset a, CharDataset::FromText(DistinctText()));
  ZO_ASSERT_OK_AND_ASSIGN(CharDataset b, CharDataset::FromText(DistinctText()));
  ZO_ASSERT_OK_AND_ASSIGN(CharBatch x, a.Sample(4, 16, 3, 1, 2));
  ZO_ASSERT_OK_AND_ASSIGN(CharBatch y, b.Sample(4, 16, 3, 1, 2));
  EXPECT_EQ(x.tokens, y.tokens);
  EXPECT_EQ(x.targets, y.targets);
  EXPECT_EQ(x.starts, y.starts);
}

TEST(CharDatasetTest, RanksStepsAndSeedsDrawDifferentWindows) {
  ZO_ASSERT_OK_AND_ASSIGN(CharDataset data, CharDataset::FromText(DistinctText()));
  ZO_ASSERT_OK_AND_ASSIGN(CharBatch r0, data.Sample(8, 16, 3, 0, 4));
  ZO_ASSERT_OK_AND_ASSIGN(CharBatch r1, data.Sample(8, 16, 3, 1, 4));
  ZO_ASSERT_OK_AND_ASSIGN(CharBatch s4, data.Sample(8, 16, 4, 0, 4));
  EXPECT_NE(r0.starts, r1.starts);
  EXPECT_NE(r0.starts, s4.starts);
  // Rows within a batch differ too.
  EXPECT_GT(std::set<int64_t>(r0.starts.begin(), r0.starts.end()).size(), 1u);
  ZO_ASSERT_OK_AND_ASSIGN(CharDataset other, CharDataset::FromText(DistinctText(), 99));
  ZO_ASSERT_OK_AND_ASSIGN(CharBatch o0, other.Sample(8, 16, 3, 0, 4));
  EXPECT_NE(r0.starts, o0.starts);
}

TEST(CharDatasetTest, CallOrderDoesNotMatter) {
  ZO_ASSERT_OK_AND_ASSIGN(CharDataset forward, CharDataset::FromText(DistinctText()));
  ZO_ASSERT_OK_AND_ASSIGN(CharDataset backward, CharDataset::FromText(DistinctText()));
  std::vector<std::vector<int64_t>> f, b;
  for (int step = 0; step < 5; ++step) {
    for (int rank = 0; rank < 3; ++rank) {
      ZO_ASSERT_OK_AND_ASSIGN(CharBatch x, forward.Sample(4, 8, step, rank, 3));
      f.push_back(x.starts);
    }
  }
  for (int step = 4; step >= 0; --step) {
    for (int rank = 2; rank >= 0; --rank) {
      ZO_ASSERT_OK_AND_ASSIGN(CharBatch x, backward.Sample(4, 8, step, rank, 3));
      b.insert(b.begin(), x.starts);
    }
  }
  EXPECT_EQ(f, b);
  // A smaller batch is a prefix of a larger one: rows are keyed, not streamed.
  ZO_ASSERT_OK_AND_ASSIGN(CharBatch big, forward.Sample(6, 8, 2, 1, 3));
  EXPECT_EQ(std::vector<int64_t>(big.starts.begin(), big.starts.begin() + 4), f[2 * 3 + 1]);
}

TEST(CharDatasetTest, EveryWindowLiesInsideTheText) {
  // block_size + 1 == text size: the only window starts at 0.
  ZO_ASSERT_OK_AND_ASSIGN(CharDataset exact, CharDataset::FromText("abcdefgh"));
  ZO_ASSERT_OK_AND_ASSIGN(CharBatch e, exact.Sample(16, 7, 0, 0, 1));
  for (int64_t s : e.starts) EXPECT_EQ(s, 0);
  // Short text, many draws: every start in range and both ends reached.
  const std::string text = "0123456789abcdef";
  ZO_ASSERT_OK_AND_ASSIGN(CharDataset data, CharDataset::FromText(text));
  std::set<int64_t> seen;
  for (uint64_t step = 0; step < 200; ++step) {
    ZO_ASSERT_OK_AND_ASSIGN(CharBatch b, data.Sample(8, 10, step, step % 2, 2));
    for (int64_t s : b.starts) {
      ASSERT_GE(s, 0);
      ASSERT_LE(s + 10 + 1, static_cast<int64_t>(text.size()));
      seen.insert(s);
    }
  }
  EXPECT_EQ(seen.size(), text.size() - 10);
}

TEST(CharDatasetTest, RejectsBadSampleArguments) {
  ZO_ASSERT_OK_AND_ASSIGN(CharDataset data, CharDataset::FromText("abcdefgh"));
  EXPECT_THAT(data.Sample(1, 8, 0, 0, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_size + 1 = 9")));
  EXPECT_THAT(data.Sample(0, 4, 0, 0, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be positive")));
  EXPECT_THAT(data.Sample(1, 0, 0, 0, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be positive")));
  EXPECT_THAT(data.Sample(1, 4, 0, 2, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dp_rank 2")));
  EXPECT_THAT(data.Sample(1, 4, 0, -1, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dp_rank -1")));
}

TEST(CharDatasetTest, MissingFileIsNotFoundNamingThePath) {
  const std::string path = ::testing::TempDir() + "/no_such_char_dataset.txt";
  EXPECT_THAT(CharDataset::FromFile(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(CharDatasetTest, EmptyOrTinyFileIsInvalidArgument) {
  const TempFile empty("");
  EXPECT_THAT(CharDataset::FromFile(empty.path()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(empty.path())));
  const TempFile tiny("abc");
  ZO_ASSERT_OK_AND_ASSIGN(CharDataset data, CharDataset::FromFile(tiny.path()));
  EXPECT_EQ(data.text(), "abc");
  EXPECT_THAT(data.Sample(1, 3, 0, 0, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shorter than block_size")));
  EXPECT_THAT(data.Sample(1, 2, 0, 0, 1), IsOk());
}

TEST(CharDatasetTest, TinyShakespeare) {
  if (!std::filesystem::exists(kShakespeare)) GTEST_SKIP() << kShakespeare << " not present";
  ZO_ASSERT_OK_AND_ASSIGN(CharDataset data, CharDataset::FromFile(kShakespeare));
  EXPECT_EQ(data.text().size(), 1115394u);
  EXPECT_EQ(data.vocab().size(), 65);
  EXPECT_EQ(data.vocab().Id('\n'), 0);
  EXPECT_EQ(data.vocab().Id(' '), 1);
  // Counted independently (and with Python): 4.7794 bits per character.
  const double counted = CountedEntropyBits(data.text());
  EXPECT_NEAR(data.UnigramEntropyBits(), counted, 1e-9);
  EXPECT_GT(data.UnigramEntropyBits(), 4.77);
  EXPECT_LT(data.UnigramEntropyBits(), 4.79);
  ZO_ASSERT_OK_AND_ASSIGN(CharBatch b, data.Sample(4, 256, 0, 0, 1));
  ZO_ASSERT_OK_AND_ASSIGN(std::string row0,
                          data.vocab().Decode(absl::MakeConstSpan(b.tokens).subspan(0, 256)));
  EXPECT_EQ(row0, data.text().substr(b.starts[0], 256));
}

TEST(SyntheticTextTest, DeterministicPerSeedAndExactLength) {
  const std::string a = SyntheticText(100000, 1);
  EXPECT_EQ(a.size(), 100000u);
  EXPECT_EQ(a, SyntheticText(100000, 1));
  EXPECT_NE(a, SyntheticText(100000, 2));
  EXPECT_EQ(SyntheticText(1000, 1), a.substr(0, 1000));
  EXPECT_EQ(SyntheticText(0, 1), "");
  for (unsigned char c : a) EXPECT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f)) << int{c};
}

TEST(SyntheticTextTest, HasStructureAModelCanLearn) {
  const std::string text = SyntheticText(1 << 20, 1337);
  const double unigram = UnigramEntropyBits(text);
  const double bigram = BigramConditionalEntropyBits(text);
  EXPECT_NEAR(unigram, CountedEntropyBits(text), 1e-9);
  EXPECT_LT(bigram, unigram - 0.5) << "unigram " << unigram << " bigram " << bigram;
  ZO_ASSERT_OK_AND_ASSIGN(CharDataset data, CharDataset::FromText(text));
  EXPECT_NEAR(data.UnigramEntropyBits(), unigram, 1e-12);
  std::printf("synthetic 1 MiB: vocab %d, unigram %.3f bits, bigram conditional %.3f bits\n",
              data.vocab().size(), unigram, bigram);
}

TEST(TextEntropyTest, KnownValues) {
  EXPECT_EQ(UnigramEntropyBits(""), 0.0);
  EXPECT_EQ(BigramConditionalEntropyBits("a"), 0.0);
  EXPECT_NEAR(UnigramEntropyBits("abab"), 1.0, 1e-12);
  EXPECT_NEAR(UnigramEntropyBits("abcd"), 2.0, 1e-12);
  // "abab...": each character fixes the next.
  EXPECT_NEAR(BigramConditionalEntropyBits("abababab"), 0.0, 1e-12);
}

}  // namespace
}  // namespace zo
