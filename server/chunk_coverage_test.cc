#include "server/chunk_coverage.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sharding.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::IsOk;
using testing::StatusIs;

constexpr auto kAlreadyExists = absl::StatusCode::kAlreadyExists;

TEST(ChunkCoverageTest, InOrderPiecesCompleteOnlyWhenEveryRankIsDone) {
  ChunkCoverage coverage(10, 2);
  EXPECT_FALSE(coverage.complete());
  ZO_ASSERT_OK_AND_ASSIGN(std::vector<FlatRange> r, coverage.Claim(0, 0, 4, false));
  EXPECT_THAT(r, ElementsAre(FlatRange{0, 4}));
  ZO_ASSERT_OK_AND_ASSIGN(r, coverage.Claim(0, 4, 10, false));
  EXPECT_THAT(r, ElementsAre(FlatRange{4, 10}));
  EXPECT_EQ(coverage.covered(0), 10);
  EXPECT_EQ(coverage.covered(1), 0);
  EXPECT_FALSE(coverage.complete()) << "rank 1 has delivered nothing";

  ZO_ASSERT_OK_AND_ASSIGN(r, coverage.Claim(1, 0, 9, false));
  EXPECT_FALSE(coverage.complete()) << "rank 1 lacks element 9";
  ZO_ASSERT_OK_AND_ASSIGN(r, coverage.Claim(1, 9, 10, false));
  EXPECT_THAT(r, ElementsAre(FlatRange{9, 10}));
  EXPECT_EQ(coverage.covered(1), 10);
  EXPECT_TRUE(coverage.complete());
}

TEST(ChunkCoverageTest, OutOfOrderPiecesComplete) {
  ChunkCoverage coverage(12, 1);
  ASSERT_THAT(coverage.Claim(0, 8, 12, false), IsOk());
  ASSERT_THAT(coverage.Claim(0, 0, 3, false), IsOk());
  ASSERT_THAT(coverage.Claim(0, 5, 8, false), IsOk());
  EXPECT_EQ(coverage.covered(0), 10);
  EXPECT_FALSE(coverage.complete());
  ZO_ASSERT_OK_AND_ASSIGN(std::vector<FlatRange> r, coverage.Claim(0, 3, 5, false));
  EXPECT_THAT(r, ElementsAre(FlatRange{3, 5}));
  EXPECT_EQ(coverage.covered(0), 12);
  EXPECT_TRUE(coverage.complete());
}

TEST(ChunkCoverageTest, RanksAreIndependent) {
  ChunkCoverage coverage(8, 3);
  ASSERT_THAT(coverage.Claim(0, 2, 6, false), IsOk());
  // The same elements from other ranks are no overlap.
  ASSERT_THAT(coverage.Claim(1, 2, 6, false), IsOk());
  ASSERT_THAT(coverage.Claim(2, 0, 8, false), IsOk());
  EXPECT_EQ(coverage.covered(0), 4);
  EXPECT_EQ(coverage.covered(1), 4);
  EXPECT_EQ(coverage.covered(2), 8);
  EXPECT_FALSE(coverage.complete());
}

struct OverlapCase {
  std::string name;
  int64_t begin;
  int64_t end;
  std::string overlap;  // the range the error names

  // ctest lists the name, not the raw bytes (heap pointers) of the struct.
  friend void PrintTo(const OverlapCase& c, std::ostream* os) { *os << c.name; }
};

class ChunkCoverageOverlapTest : public ::testing::TestWithParam<OverlapCase> {};

// Rank 0 holds [4, 8) of a 12-element chunk; every case overlaps it.
TEST_P(ChunkCoverageOverlapTest, RejectedAndNothingMarked) {
  const OverlapCase& c = GetParam();
  ChunkCoverage coverage(12, 2);
  ASSERT_THAT(coverage.Claim(0, 4, 8, false), IsOk());
  EXPECT_THAT(coverage.Claim(0, c.begin, c.end, false),
              StatusIs(kAlreadyExists, HasSubstr(absl::StrCat("elements ", c.overlap))));
  EXPECT_EQ(coverage.covered(0), 4);
  EXPECT_EQ(coverage.covered(1), 0);
  // Nothing of the rejected piece was marked: the free elements on either
  // side can still be claimed one by one, and together they finish rank 0.
  for (int64_t i = 0; i < 12; ++i) {
    if (i >= 4 && i < 8) continue;
    ZO_ASSERT_OK_AND_ASSIGN(std::vector<FlatRange> r, coverage.Claim(0, i, i + 1, false));
    EXPECT_THAT(r, ElementsAre(FlatRange{i, i + 1}));
  }
  EXPECT_EQ(coverage.covered(0), 12);
  EXPECT_FALSE(coverage.complete());
  ASSERT_THAT(coverage.Claim(1, 0, 12, false), IsOk());
  EXPECT_TRUE(coverage.complete());
}

INSTANTIATE_TEST_SUITE_P(Cases, ChunkCoverageOverlapTest,
                         ::testing::Values(OverlapCase{"PartialLeft", 2, 5, "[4, 5)"},
                                           OverlapCase{"PartialRight", 7, 10, "[7, 8)"},
                                           OverlapCase{"Containing", 0, 12, "[4, 8)"},
                                           OverlapCase{"Contained", 5, 6, "[5, 6)"},
                                           OverlapCase{"Identical", 4, 8, "[4, 8)"},
                                           OverlapCase{"SameBegin", 4, 5, "[4, 5)"},
                                           OverlapCase{"SameEnd", 6, 8, "[6, 8)"}),
                         [](const ::testing::TestParamInfo<OverlapCase>& info) {
                           return info.param.name;
                         });

TEST(ChunkCoverageTest, OverlapNamesRankAndFirstOverlappingRange) {
  ChunkCoverage coverage(20, 4);
  ASSERT_THAT(coverage.Claim(3, 2, 4, false), IsOk());
  ASSERT_THAT(coverage.Claim(3, 10, 12, false), IsOk());
  EXPECT_THAT(coverage.Claim(3, 0, 20, false),
              StatusIs(kAlreadyExists, HasSubstr("elements [2, 4) of this chunk were already "
                                                 "pushed by dp rank 3")));
  EXPECT_EQ(coverage.covered(3), 4);
}

TEST(ChunkCoverageTest, TouchingPiecesAreNoOverlap) {
  ChunkCoverage coverage(12, 1);
  ASSERT_THAT(coverage.Claim(0, 4, 8, false), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(std::vector<FlatRange> r, coverage.Claim(0, 0, 4, false));
  EXPECT_THAT(r, ElementsAre(FlatRange{0, 4}));
  ZO_ASSERT_OK_AND_ASSIGN(r, coverage.Claim(0, 8, 12, false));
  EXPECT_THAT(r, ElementsAre(FlatRange{8, 12}));
  EXPECT_EQ(coverage.covered(0), 12);
  EXPECT_TRUE(coverage.complete());
  // Now merged into one range: any single element overlaps.
  for (int64_t i = 0; i < 12; ++i) {
    EXPECT_THAT(coverage.Claim(0, i, i + 1, false),
                StatusIs(kAlreadyExists, HasSubstr(absl::StrCat("[", i, ", ", i + 1, ")"))));
  }
  EXPECT_EQ(coverage.covered(0), 12);
  EXPECT_TRUE(coverage.complete());
}

// What a lent place asks: has the rank delivered any element of a range.
TEST(ChunkCoverageTest, DeliveredAnySeesEveryOverlapAndNothingBeside) {
  ChunkCoverage coverage(20, 2);
  ASSERT_THAT(coverage.Claim(0, 4, 8, false), IsOk());
  ASSERT_THAT(coverage.Claim(0, 12, 14, false), IsOk());
  for (int64_t b = 0; b < 20; ++b) {
    for (int64_t e = b + 1; e <= 20; ++e) {
      const bool overlaps = (b < 8 && e > 4) || (b < 14 && e > 12);
      EXPECT_EQ(coverage.DeliveredAny(0, b, e), overlaps) << "[" << b << ", " << e << ")";
    }
  }
  EXPECT_FALSE(coverage.DeliveredAny(1, 0, 20)) << "rank 1 delivered nothing";
  coverage.Reset();
  EXPECT_FALSE(coverage.DeliveredAny(0, 0, 20));
}

TEST(ChunkCoverageTest, ResendReturnsExactlyTheGaps) {
  ChunkCoverage coverage(12, 1);
  ASSERT_THAT(coverage.Claim(0, 2, 4, false), IsOk());
  ASSERT_THAT(coverage.Claim(0, 6, 8, false), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(std::vector<FlatRange> r, coverage.Claim(0, 0, 12, true));
  EXPECT_THAT(r, ElementsAre(FlatRange{0, 2}, FlatRange{4, 6}, FlatRange{8, 12}));
  EXPECT_EQ(coverage.covered(0), 12);
  EXPECT_TRUE(coverage.complete());
}

TEST(ChunkCoverageTest, ResendPartialAndEdgeCases) {
  ChunkCoverage coverage(12, 1);
  ASSERT_THAT(coverage.Claim(0, 3, 6, false), IsOk());
  // Starts inside a delivered range, ends inside the free space.
  ZO_ASSERT_OK_AND_ASSIGN(std::vector<FlatRange> r, coverage.Claim(0, 4, 8, true));
  EXPECT_THAT(r, ElementsAre(FlatRange{6, 8}));
  EXPECT_EQ(coverage.covered(0), 5);
  // Entirely delivered already: nothing to accumulate, nothing changes.
  ZO_ASSERT_OK_AND_ASSIGN(r, coverage.Claim(0, 3, 8, true));
  EXPECT_THAT(r, IsEmpty());
  EXPECT_EQ(coverage.covered(0), 5);
  // No overlap: the whole piece, as without resend.
  ZO_ASSERT_OK_AND_ASSIGN(r, coverage.Claim(0, 9, 11, true));
  EXPECT_THAT(r, ElementsAre(FlatRange{9, 11}));
  // Ends inside a delivered range.
  ZO_ASSERT_OK_AND_ASSIGN(r, coverage.Claim(0, 0, 4, true));
  EXPECT_THAT(r, ElementsAre(FlatRange{0, 3}));
  EXPECT_EQ(coverage.covered(0), 10);
  EXPECT_FALSE(coverage.complete());
  ZO_ASSERT_OK_AND_ASSIGN(r, coverage.Claim(0, 0, 12, true));
  EXPECT_THAT(r, ElementsAre(FlatRange{8, 9}, FlatRange{11, 12}));
  EXPECT_TRUE(coverage.complete());
}

TEST(ChunkCoverageTest, ResendOfACompleteRankDoesNotCountItTwice) {
  ChunkCoverage coverage(6, 2);
  ASSERT_THAT(coverage.Claim(0, 0, 6, false), IsOk());
  for (int i = 0; i < 3; ++i) {
    ZO_ASSERT_OK_AND_ASSIGN(std::vector<FlatRange> r, coverage.Claim(0, 0, 6, true));
    EXPECT_THAT(r, IsEmpty());
  }
  EXPECT_FALSE(coverage.complete()) << "rank 1 has delivered nothing";
  ASSERT_THAT(coverage.Claim(1, 0, 6, false), IsOk());
  EXPECT_TRUE(coverage.complete());
}

TEST(ChunkCoverageTest, ResetStartsOver) {
  ChunkCoverage coverage(8, 2);
  ASSERT_THAT(coverage.Claim(0, 0, 8, false), IsOk());
  ASSERT_THAT(coverage.Claim(1, 0, 8, false), IsOk());
  ASSERT_TRUE(coverage.complete());
  coverage.Reset();
  EXPECT_FALSE(coverage.complete());
  EXPECT_EQ(coverage.covered(0), 0);
  EXPECT_EQ(coverage.covered(1), 0);
  // The same pieces are accepted again.
  ZO_ASSERT_OK_AND_ASSIGN(std::vector<FlatRange> r, coverage.Claim(0, 2, 5, false));
  EXPECT_THAT(r, ElementsAre(FlatRange{2, 5}));
  ASSERT_THAT(coverage.Claim(0, 0, 2, false), IsOk());
  ASSERT_THAT(coverage.Claim(0, 5, 8, false), IsOk());
  ASSERT_THAT(coverage.Claim(1, 0, 8, false), IsOk());
  EXPECT_TRUE(coverage.complete());
}

// A per-rank bitmap: the obvious model of ChunkCoverage.
class CoverageModel {
 public:
  CoverageModel(int64_t elems, int ranks)
      : elems_(elems), bits_(ranks, std::vector<bool>(elems, false)) {}

  int64_t covered(int rank) const {
    int64_t n = 0;
    for (bool b : bits_[rank]) n += b ? 1 : 0;
    return n;
  }
  bool complete() const {
    for (size_t r = 0; r < bits_.size(); ++r) {
      if (covered(static_cast<int>(r)) != elems_) return false;
    }
    return true;
  }
  // The first maximal delivered run that meets [begin, end), clipped to it.
  std::optional<FlatRange> FirstOverlap(int rank, int64_t begin, int64_t end) const {
    const std::vector<bool>& b = bits_[rank];
    for (int64_t i = begin; i < end; ++i) {
      if (!b[i]) continue;
      int64_t j = i;
      while (j < end && b[j]) ++j;
      return FlatRange{i, j};
    }
    return std::nullopt;
  }
  // Marks [begin, end) and returns the maximal runs that were not yet marked.
  std::vector<FlatRange> Mark(int rank, int64_t begin, int64_t end) {
    std::vector<bool>& b = bits_[rank];
    std::vector<FlatRange> gaps;
    for (int64_t i = begin; i < end;) {
      if (b[i]) {
        ++i;
        continue;
      }
      int64_t j = i;
      while (j < end && !b[j]) b[j++] = true;
      gaps.push_back({i, j});
      i = j;
    }
    return gaps;
  }
  void Reset() {
    for (auto& b : bits_) b.assign(elems_, false);
  }

 private:
  int64_t elems_;
  std::vector<std::vector<bool>> bits_;
};

TEST(ChunkCoverageTest, RandomClaimsMatchBitmapModel) {
  std::mt19937_64 rng(20240611);
  for (int round = 0; round < 20; ++round) {
    const int64_t elems = std::uniform_int_distribution<int64_t>(1, 80)(rng);
    const int ranks = std::uniform_int_distribution<int>(1, 4)(rng);
    ChunkCoverage coverage(elems, ranks);
    CoverageModel model(elems, ranks);
    int completions = 0;
    for (int i = 0; i < 2000; ++i) {
      SCOPED_TRACE(absl::StrCat("round ", round, " claim ", i, " elems ", elems));
      if (std::uniform_int_distribution<int>(0, 499)(rng) == 0) {
        coverage.Reset();
        model.Reset();
      }
      const int rank = std::uniform_int_distribution<int>(0, ranks - 1)(rng);
      // Mostly short pieces, so that ranks fill up gradually.
      const int64_t max_len = std::uniform_int_distribution<int>(0, 9)(rng) == 0 ? elems : 6;
      const int64_t begin = std::uniform_int_distribution<int64_t>(0, elems - 1)(rng);
      const int64_t end =
          std::min(elems, begin + std::uniform_int_distribution<int64_t>(1, max_len)(rng));
      const bool resend = std::uniform_int_distribution<int>(0, 3)(rng) == 0;

      absl::StatusOr<std::vector<FlatRange>> got = coverage.Claim(rank, begin, end, resend);
      const std::optional<FlatRange> overlap = model.FirstOverlap(rank, begin, end);
      if (!resend && overlap.has_value()) {
        ASSERT_THAT(
            got, StatusIs(kAlreadyExists, HasSubstr(absl::StrCat("elements [", overlap->begin, ", ",
                                                                 overlap->end, ")"))));
      } else {
        ASSERT_THAT(got, IsOk());
        ASSERT_EQ(*got, model.Mark(rank, begin, end)) << "[" << begin << ", " << end << ")";
      }
      for (int r = 0; r < ranks; ++r) ASSERT_EQ(coverage.covered(r), model.covered(r));
      ASSERT_EQ(coverage.complete(), model.complete());
      if (model.complete()) {
        ++completions;
        coverage.Reset();
        model.Reset();
      }
    }
    if (elems <= 20) {
      EXPECT_GT(completions, 0);
    }
  }
}

}  // namespace
}  // namespace zo
