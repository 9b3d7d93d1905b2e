#include "offload/checkpoint/checkpoint_dir.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "offload/checkpoint/checkpoint_test_util.h"
#include "offload/checkpoint/durable_file.h"

namespace zo {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::zo::testing::FlatState;
using ::zo::testing::FlipByte;
using ::zo::testing::FreshTestDir;
using ::zo::testing::IsOk;
using ::zo::testing::MakeFlatState;
using ::zo::testing::StatusIs;
using ::zo::testing::TestMeta;
using ::zo::testing::WriteTestCheckpoint;
using ::zo::testing::WriteTestPart;

// 87024 elements in chunks of 20000: chunks 0..4, the last 7024 long; on 2
// servers part 0 holds chunks 0, 2, 4 and part 1 chunks 1, 3. Chunks are not
// multiples of a 64 KiB block (16384 elements), so reads cross both.
FlatState TwoServerState() {
  return MakeFlatState({{"embed", {300, 100}, DType::kFloat16},
                        {"w1", {20011}, DType::kBFloat16},
                        {"w2", {7, 1000}, DType::kFloat16},
                        {"bias", {13}, DType::kFloat32},
                        {"w3", {30000}, DType::kFloat16}},
                       /*chunk_elems=*/20000, /*num_servers=*/2, /*seed=*/7);
}

// CheckpointMeta's defaulted == needs one on TensorSpec, which has none.
void ExpectSameMeta(const CheckpointMeta& a, const CheckpointMeta& b) {
  EXPECT_EQ(a.format_version, b.format_version);
  EXPECT_EQ(a.job, b.job);
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.applied_steps, b.applied_steps);
  EXPECT_EQ(a.loss_scale, b.loss_scale);
  EXPECT_EQ(a.scaler_iteration, b.scaler_iteration);
  EXPECT_EQ(a.scaler_last_overflow_iteration, b.scaler_last_overflow_iteration);
  EXPECT_EQ(a.scaler_hysteresis_left, b.scaler_hysteresis_left);
  EXPECT_EQ(a.has_last_step, b.has_last_step);
  EXPECT_EQ(std::isnan(a.last_grad_norm), std::isnan(b.last_grad_norm));
  if (!std::isnan(a.last_grad_norm)) {
    EXPECT_EQ(a.last_grad_norm, b.last_grad_norm);
  }
  EXPECT_EQ(a.last_lr, b.last_lr);
  EXPECT_EQ(a.last_group_lr, b.last_group_lr);
  EXPECT_EQ(a.last_group_hyper, b.last_group_hyper);
  EXPECT_EQ(a.last_skipped, b.last_skipped);
  EXPECT_EQ(a.has_previous, b.has_previous);
  EXPECT_EQ(a.previous_version, b.previous_version);
  EXPECT_EQ(a.previous_loss_scale, b.previous_loss_scale);
  EXPECT_EQ(a.previous_dtype, b.previous_dtype);
  EXPECT_EQ(a.previous_same_data, b.previous_same_data);
  ASSERT_EQ(a.manifest.size(), b.manifest.size());
  for (size_t i = 0; i < a.manifest.size(); ++i) {
    EXPECT_EQ(a.manifest[i].name, b.manifest[i].name);
    EXPECT_EQ(a.manifest[i].shape, b.manifest[i].shape);
    EXPECT_EQ(a.manifest[i].dtype, b.manifest[i].dtype);
  }
  EXPECT_EQ(a.chunk_elems, b.chunk_elems);
  EXPECT_EQ(a.num_servers, b.num_servers);
  EXPECT_EQ(a.dp_world_size, b.dp_world_size);
  EXPECT_EQ(a.config_json, b.config_json);
  EXPECT_EQ(a.init_fingerprint, b.init_fingerprint);
  EXPECT_EQ(a.parts, b.parts);
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = FreshTestDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string root_;
};

TEST_F(CheckpointDirTest, NamesArePadded) {
  EXPECT_EQ(CheckpointDirName(20), "step-00000020");
  EXPECT_EQ(CheckpointPartFileName(3), "part-00003.zop");
}

TEST_F(CheckpointDirTest, PruneKeepsTheNewestCommittedOnesAndEveryTemporaryOne) {
  for (int64_t v : {3, 10, 7, 20}) fs::create_directories(root_ + "/job/" + CheckpointDirName(v));
  fs::create_directories(root_ + "/job/" + CheckpointDirName(30) + ".tmp");  // being written
  fs::create_directories(root_ + "/other/" + CheckpointDirName(1));          // another job
  ZO_ASSERT_OK_AND_ASSIGN(std::vector<std::string> removed, PruneCheckpoints(root_, "job", 2));
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed,
            (std::vector<std::string>{root_ + "/job/step-00000003", root_ + "/job/step-00000007"}));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(root_ + "/job")) {
    left.push_back(e.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left,
            (std::vector<std::string>{"step-00000010", "step-00000020", "step-00000030.tmp"}));
  EXPECT_TRUE(fs::exists(root_ + "/other/step-00000001"));
  ZO_ASSERT_OK_AND_ASSIGN(removed, PruneCheckpoints(root_, "job", 2));
  EXPECT_TRUE(removed.empty());
  EXPECT_THAT(PruneCheckpoints(root_, "job", 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("keep 0")));
}

TEST_F(CheckpointDirTest, CommitRenamesAndTheMetaRoundTrips) {
  const FlatState s = TwoServerState();
  ZO_ASSERT_OK_AND_ASSIGN(const std::string tmp, BeginCheckpoint(root_, "gpt", 20));
  EXPECT_EQ(tmp, root_ + "/gpt/step-00000020.tmp");
  CheckpointMeta meta = TestMeta("gpt", 20, s);
  for (int server = 0; server < 2; ++server) {
    ZO_ASSERT_OK_AND_ASSIGN(CheckpointPartSummary part, WriteTestPart(tmp, s, server));
    meta.parts.push_back(part);
  }
  ZO_ASSERT_OK_AND_ASSIGN(const std::string dir, CommitCheckpoint(tmp, meta));
  EXPECT_EQ(dir, root_ + "/gpt/step-00000020");
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_TRUE(fs::exists(dir + "/checkpoint.json"));
  EXPECT_FALSE(fs::exists(dir + "/checkpoint.json.tmp"));
  ZO_ASSERT_OK_AND_ASSIGN(const CheckpointMeta read, ReadCheckpointMeta(dir));
  ExpectSameMeta(read, meta);
  ZO_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(dir));
  ExpectSameMeta(reader->meta(), meta);
  EXPECT_EQ(reader->total_elems(), 87024);
}

// The fingerprint of what the job started from: all 64 bits through JSON
// (as hex: a JSON number may keep only 53), and none when the job had none.
TEST_F(CheckpointDirTest, TheInitFingerprintRoundTripsAndIsOptional) {
  const FlatState s = TwoServerState();
  for (uint64_t fingerprint : {uint64_t{0xf00dfacec0ffee01}, uint64_t{0}}) {
    SCOPED_TRACE(fingerprint);
    const int64_t version = fingerprint != 0 ? 20 : 21;
    ZO_ASSERT_OK_AND_ASSIGN(const std::string tmp, BeginCheckpoint(root_, "gpt", version));
    CheckpointMeta meta = TestMeta("gpt", version, s);
    meta.init_fingerprint = fingerprint;
    for (int server = 0; server < 2; ++server) {
      ZO_ASSERT_OK_AND_ASSIGN(CheckpointPartSummary part, WriteTestPart(tmp, s, server));
      meta.parts.push_back(part);
    }
    ZO_ASSERT_OK_AND_ASSIGN(const std::string dir, CommitCheckpoint(tmp, meta));
    std::ifstream in(dir + "/checkpoint.json");
    const nlohmann::json doc = nlohmann::json::parse(in);
    if (fingerprint != 0) {
      EXPECT_EQ(doc["init_fingerprint"], "f00dfacec0ffee01");
    } else {
      EXPECT_FALSE(doc.contains("init_fingerprint"));
    }
    ZO_ASSERT_OK_AND_ASSIGN(const CheckpointMeta read, ReadCheckpointMeta(dir));
    ExpectSameMeta(read, meta);
  }
}

// Failed and interrupted attempts leave *.tmp directories; the next
// checkpoint of the job removes them all, and a failed one removes its own.
TEST_F(CheckpointDirTest, TemporaryDirectoriesOfFailedAttemptsDoNotPileUp) {
  ZO_ASSERT_OK_AND_ASSIGN(const std::string a, BeginCheckpoint(root_, "gpt", 5));
  std::ofstream(a + "/part-00000.zop") << "half a part";
  fs::create_directories(root_ + "/other/step-00000005.tmp");  // another job's: kept
  ZO_ASSERT_OK_AND_ASSIGN(const std::string b, BeginCheckpoint(root_, "gpt", 10));
  EXPECT_FALSE(fs::exists(a));
  EXPECT_TRUE(fs::exists(b));
  EXPECT_TRUE(fs::exists(root_ + "/other/step-00000005.tmp"));
  EXPECT_THAT(AbandonCheckpoint(b), IsOk());
  EXPECT_FALSE(fs::exists(b));
  EXPECT_THAT(AbandonCheckpoint(root_ + "/gpt"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a temporary")));
  EXPECT_TRUE(fs::exists(root_ + "/gpt"));
}

TEST_F(CheckpointDirTest, TheLastStepRoundTripsNonFiniteNormIncluded) {
  const FlatState s = TwoServerState();
  for (double norm : {0.8125, std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(norm);
    const int64_t version = std::isfinite(norm) ? 20 : 21;
    ZO_ASSERT_OK_AND_ASSIGN(const std::string tmp, BeginCheckpoint(root_, "gpt", version));
    CheckpointMeta meta = TestMeta("gpt", version, s);
    meta.has_last_step = true;
    meta.last_grad_norm = norm;
    meta.last_lr = 6e-4;
    meta.last_skipped = !std::isfinite(norm);
    if (std::isfinite(norm)) {  // a step the worker gave its groups' settings
      meta.last_group_lr = {6e-4, 3e-4};
      meta.last_group_hyper = {{.betas = {0.85, 0.99}, .eps = 1e-6, .weight_decay = 0.1},
                               {.betas = {0.9, 0.95}, .eps = 3e-8, .weight_decay = 0.0}};
    }
    for (int server = 0; server < 2; ++server) {
      ZO_ASSERT_OK_AND_ASSIGN(CheckpointPartSummary part, WriteTestPart(tmp, s, server));
      meta.parts.push_back(part);
    }
    ZO_ASSERT_OK_AND_ASSIGN(const std::string dir, CommitCheckpoint(tmp, meta));
    ZO_ASSERT_OK_AND_ASSIGN(const CheckpointMeta read, ReadCheckpointMeta(dir));
    if (!std::isfinite(norm)) meta.last_grad_norm = std::numeric_limits<double>::quiet_NaN();
    ExpectSameMeta(read, meta);
  }
}

// The version before the checkpoint's (a delayed parameter update computes
// its next step on it): the meta's record round-trips, and its 16-bit
// weights read back across chunks and parts.
TEST_F(CheckpointDirTest, ThePreviousVersionRoundTripsAndReadsAcrossParts) {
  const FlatState s = TwoServerState();
  const auto total = static_cast<int64_t>(s.master.size());
  std::vector<std::byte> previous(2 * total);
  for (size_t i = 0; i < previous.size(); ++i) previous[i] = static_cast<std::byte>(i * 37 % 251);
  ZO_ASSERT_OK_AND_ASSIGN(const std::string tmp, BeginCheckpoint(root_, "gpt", 20));
  CheckpointMeta meta = TestMeta("gpt", 20, s);
  meta.has_previous = true;
  meta.previous_version = 19;
  meta.previous_loss_scale = 65536.0;
  meta.previous_dtype = "fp16";
  for (int server = 0; server < 2; ++server) {
    ZO_ASSERT_OK_AND_ASSIGN(CheckpointPartSummary part, WriteTestPart(tmp, s, server, &previous));
    meta.parts.push_back(part);
  }
  ZO_ASSERT_OK_AND_ASSIGN(const std::string dir, CommitCheckpoint(tmp, meta));
  ZO_ASSERT_OK_AND_ASSIGN(const CheckpointMeta read, ReadCheckpointMeta(dir));
  ExpectSameMeta(read, meta);
  ZO_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(dir));
  std::vector<std::byte> all(previous.size());
  ASSERT_THAT(reader->ReadPreviousFlat(0, total, all.data()), IsOk());
  EXPECT_TRUE(all == previous);
  std::vector<std::byte> some(2 * 30000);
  ASSERT_THAT(reader->ReadPreviousFlat(19999, 30000, some.data()), IsOk());  // chunks 0, 1, 2
  EXPECT_TRUE(std::equal(some.begin(), some.end(), previous.begin() + 2 * 19999));
  EXPECT_THAT(reader->ReadPreviousFlat(total - 1, 2, some.data()),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("outside")));
}

TEST_F(CheckpointDirTest, APreviousVersionTheMetaAndPartsDisagreeOnFailsTheCommit) {
  const FlatState s = TwoServerState();
  {
    // The meta lists weights of the version before; the parts carry none.
    ZO_ASSERT_OK_AND_ASSIGN(const std::string tmp, BeginCheckpoint(root_, "gpt", 20));
    CheckpointMeta meta = TestMeta("gpt", 20, s);
    meta.has_previous = true;
    meta.previous_version = 19;
    meta.previous_dtype = "bf16";
    for (int server = 0; server < 2; ++server) {
      ZO_ASSERT_OK_AND_ASSIGN(CheckpointPartSummary part, WriteTestPart(tmp, s, server));
      meta.parts.push_back(part);
    }
    EXPECT_THAT(CommitCheckpoint(tmp, meta).status(),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(HasSubstr("part-00000.zop"), HasSubstr("previous version"))));
    // With the same data as version 20 the parts need none.
    meta.previous_same_data = true;
    ZO_ASSERT_OK_AND_ASSIGN(const std::string dir, CommitCheckpoint(tmp, meta));
    ZO_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(dir));
    std::vector<std::byte> out(2);
    EXPECT_THAT(reader->ReadPreviousFlat(0, 1, out.data()),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no previous")));
  }
  ZO_ASSERT_OK_AND_ASSIGN(const std::string tmp, BeginCheckpoint(root_, "gpt", 21));
  CheckpointMeta meta = TestMeta("gpt", 21, s);
  meta.has_previous = true;
  meta.previous_version = 19;  // not 20
  meta.previous_dtype = "fp16";
  meta.previous_same_data = true;
  for (int server = 0; server < 2; ++server) {
    ZO_ASSERT_OK_AND_ASSIGN(CheckpointPartSummary part, WriteTestPart(tmp, s, server));
    meta.parts.push_back(part);
  }
  EXPECT_THAT(CommitCheckpoint(tmp, meta).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("previous.version 19")));
}

TEST_F(CheckpointDirTest, ReadFlatAcrossChunksAndPartsMatchesTheOriginal) {
  const FlatState s = TwoServerState();
  ZO_ASSERT_OK_AND_ASSIGN(const std::string dir, WriteTestCheckpoint(root_, "gpt", 3, s));
  ZO_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(dir));
  const int64_t total = reader->total_elems();
  std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, total},     {19999, 2}, {19990, 20020}, {39999, 40001}, {80000, 7024},
      {total - 1, 1}, {16383, 2}, {5, 0},         {60000, 20000}, {1, total - 2}};
  std::mt19937_64 rng(42);
  for (int i = 0; i < 40; ++i) {
    const int64_t begin = static_cast<int64_t>(rng() % static_cast<uint64_t>(total));
    const int64_t len = static_cast<int64_t>(rng() % static_cast<uint64_t>(total - begin + 1));
    ranges.emplace_back(begin, len);
  }
  for (const auto& [begin, len] : ranges) {
    SCOPED_TRACE(absl::StrCat("flat [", begin, ", ", begin + len, ")"));
    std::vector<float> master(len), m(len), v(len);
    ASSERT_THAT(
        reader->ReadFlat(begin, absl::MakeSpan(master), absl::MakeSpan(m), absl::MakeSpan(v)),
        IsOk());
    EXPECT_TRUE(std::equal(master.begin(), master.end(), s.master.begin() + begin));
    EXPECT_TRUE(std::equal(m.begin(), m.end(), s.m.begin() + begin));
    EXPECT_TRUE(std::equal(v.begin(), v.end(), s.v.begin() + begin));
    std::vector<float> only_master(len);
    ASSERT_THAT(reader->ReadFlat(begin, absl::MakeSpan(only_master), {}, {}), IsOk());
    EXPECT_EQ(only_master, master);
  }
}

TEST_F(CheckpointDirTest, ReadFlatRejectsBadRanges) {
  ZO_ASSERT_OK_AND_ASSIGN(const std::string dir,
                          WriteTestCheckpoint(root_, "gpt", 3, TwoServerState()));
  ZO_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(dir));
  std::vector<float> a(10), b(11);
  EXPECT_THAT(reader->ReadFlat(87020, absl::MakeSpan(a), {}, {}),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("87024 elements")));
  EXPECT_THAT(reader->ReadFlat(-1, absl::MakeSpan(a), {}, {}),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr(dir)));
  EXPECT_THAT(reader->ReadFlat(0, absl::MakeSpan(a), absl::MakeSpan(b), {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one size")));
}

TEST_F(CheckpointDirTest, ACorruptBlockIsDataLossOnlyWhereItIs) {
  const FlatState s = TwoServerState();
  ZO_ASSERT_OK_AND_ASSIGN(const std::string dir, WriteTestCheckpoint(root_, "gpt", 3, s));
  // Part 1's first chunk is chunk 1; its master starts after the 4 KiB header.
  ASSERT_THAT(FlipByte(dir + "/part-00001.zop", 4096 + 100), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(dir));
  std::vector<float> buf(100);
  EXPECT_THAT(reader->ReadFlat(20000, absl::MakeSpan(buf), {}, {}),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("part-00001.zop"), HasSubstr("chunk 1"))));
  ASSERT_THAT(reader->ReadFlat(20000, {}, absl::MakeSpan(buf), {}), IsOk());  // m is fine
  ASSERT_THAT(reader->ReadFlat(0, absl::MakeSpan(buf), {}, {}), IsOk());      // so is part 0
  EXPECT_TRUE(std::equal(buf.begin(), buf.end(), s.master.begin()));
}

TEST_F(CheckpointDirTest, AMissingPartFailsTheCommitAndKeepsTheTmpDir) {
  const FlatState s = TwoServerState();
  ZO_ASSERT_OK_AND_ASSIGN(const std::string tmp, BeginCheckpoint(root_, "gpt", 5));
  CheckpointMeta meta = TestMeta("gpt", 5, s);
  ZO_ASSERT_OK_AND_ASSIGN(CheckpointPartSummary part0, WriteTestPart(tmp, s, 0));
  meta.parts = {part0, CheckpointPartSummary{"part-00001.zop", 123456, 0x1234}};
  EXPECT_THAT(
      CommitCheckpoint(tmp, meta),
      StatusIs(absl::StatusCode::kNotFound, AllOf(HasSubstr(tmp), HasSubstr("part-00001.zop"))));
  EXPECT_TRUE(fs::exists(tmp + "/part-00000.zop"));
  EXPECT_FALSE(fs::exists(tmp + "/checkpoint.json"));
  EXPECT_FALSE(fs::exists(root_ + "/gpt/step-00000005"));
  EXPECT_THAT(LatestCheckpoint(root_, "gpt"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(root_)));
}

TEST_F(CheckpointDirTest, APartThatDiffersFromTheMetaFailsTheCommit) {
  const FlatState s = TwoServerState();
  ZO_ASSERT_OK_AND_ASSIGN(const std::string tmp, BeginCheckpoint(root_, "gpt", 5));
  CheckpointMeta meta = TestMeta("gpt", 5, s);
  for (int server = 0; server < 2; ++server) {
    ZO_ASSERT_OK_AND_ASSIGN(CheckpointPartSummary part, WriteTestPart(tmp, s, server));
    meta.parts.push_back(part);
  }
  CheckpointMeta wrong_checksum = meta;
  wrong_checksum.parts[1].index_checksum ^= 1;
  EXPECT_THAT(CommitCheckpoint(tmp, wrong_checksum),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("part-00001.zop"), HasSubstr("index checksum"))));
  // Parts written for another chunk size do not hold the chunks the meta implies.
  CheckpointMeta wrong_chunks = meta;
  wrong_chunks.chunk_elems = 30000;
  EXPECT_THAT(CommitCheckpoint(tmp, wrong_chunks),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("the manifest puts")));
  CheckpointMeta wrong_count = meta;
  wrong_count.num_servers = 3;
  EXPECT_THAT(CommitCheckpoint(tmp, wrong_count),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_servers 3")));
  EXPECT_TRUE(fs::exists(tmp));
  EXPECT_THAT(CommitCheckpoint(tmp, meta), IsOk());
}

TEST_F(CheckpointDirTest, CommitWantsTheDirectoryOfTheMetasJobAndVersion) {
  const FlatState s = TwoServerState();
  ZO_ASSERT_OK_AND_ASSIGN(const std::string tmp, BeginCheckpoint(root_, "gpt", 5));
  CheckpointMeta meta = TestMeta("gpt", 5, s);
  for (int server = 0; server < 2; ++server) {
    ZO_ASSERT_OK_AND_ASSIGN(CheckpointPartSummary part, WriteTestPart(tmp, s, server));
    meta.parts.push_back(part);
  }
  CheckpointMeta other_version = meta;
  other_version.version = 6;
  EXPECT_THAT(CommitCheckpoint(tmp, other_version),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("gpt/step-00000006.tmp")));
  CheckpointMeta other_job = meta;
  other_job.job = "bert";
  EXPECT_THAT(CommitCheckpoint(tmp, other_job),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bert/step-00000005.tmp")));
  EXPECT_THAT(CommitCheckpoint(tmp + "/", meta), IsOk());
}

TEST_F(CheckpointDirTest, AnExistingVersionIsAlreadyExists) {
  const FlatState s = TwoServerState();
  ASSERT_THAT(WriteTestCheckpoint(root_, "gpt", 5, s), IsOk());
  EXPECT_THAT(BeginCheckpoint(root_, "gpt", 5),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("step-00000005")));
  // A second commit that got past Begin (two leads) does not replace it.
  const std::string tmp = root_ + "/gpt/step-00000005.tmp";
  fs::create_directories(tmp);
  CheckpointMeta meta = TestMeta("gpt", 5, s);
  for (int server = 0; server < 2; ++server) {
    ZO_ASSERT_OK_AND_ASSIGN(CheckpointPartSummary part, WriteTestPart(tmp, s, server));
    meta.parts.push_back(part);
  }
  EXPECT_THAT(CommitCheckpoint(tmp, meta),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("step-00000005")));
  EXPECT_TRUE(fs::exists(tmp));
}

TEST_F(CheckpointDirTest, LatestPicksTheHighestCommittedIgnoringTmpAndBrokenDirs) {
  const FlatState s = TwoServerState();
  EXPECT_THAT(LatestCheckpoint(root_, "gpt"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(root_ + "/gpt")));
  ASSERT_THAT(WriteTestCheckpoint(root_, "gpt", 10, s), IsOk());
  ASSERT_THAT(WriteTestCheckpoint(root_, "gpt", 20, s), IsOk());
  ASSERT_THAT(WriteTestCheckpoint(root_, "other", 90, s), IsOk());
  // Newer, but not committed: a tmp dir with parts, a dir without a record,
  // one whose record is garbage, one whose record names another version.
  ZO_ASSERT_OK_AND_ASSIGN(const std::string tmp, BeginCheckpoint(root_, "gpt", 30));
  ASSERT_THAT(WriteTestPart(tmp, s, 0), IsOk());
  fs::create_directories(root_ + "/gpt/step-00000040");
  fs::create_directories(root_ + "/gpt/step-00000050");
  WriteText(root_ + "/gpt/step-00000050/checkpoint.json", "{not json");
  fs::copy(root_ + "/gpt/step-00000010", root_ + "/gpt/step-00000060", fs::copy_options::recursive);
  WriteText(root_ + "/gpt/not-a-step", "");
  ZO_ASSERT_OK_AND_ASSIGN(const std::string latest, LatestCheckpoint(root_, "gpt"));
  EXPECT_EQ(latest, root_ + "/gpt/step-00000020");
}

TEST_F(CheckpointDirTest, BeginRemovesAStaleAttempt) {
  ZO_ASSERT_OK_AND_ASSIGN(const std::string tmp, BeginCheckpoint(root_, "gpt", 7));
  WriteText(tmp + "/part-00000.zop", "half written");
  ZO_ASSERT_OK_AND_ASSIGN(const std::string again, BeginCheckpoint(root_, "gpt", 7));
  EXPECT_EQ(again, tmp);
  EXPECT_TRUE(fs::is_empty(tmp));
  EXPECT_THAT(BeginCheckpoint(root_, "../etc", 7),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job name '../etc'")));
  EXPECT_THAT(BeginCheckpoint(root_, "gpt", -1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("-1")));
}

TEST_F(CheckpointDirTest, ReadMetaNamesTheFileAndTheField) {
  const std::string dir = root_ + "/step-00000001";
  fs::create_directories(dir);
  const std::string file = dir + "/checkpoint.json";
  EXPECT_THAT(ReadCheckpointMeta(dir), StatusIs(absl::StatusCode::kNotFound, HasSubstr(file)));
  WriteText(file, "[1, 2");
  EXPECT_THAT(ReadCheckpointMeta(dir), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(file)));

  // A good record, then one field broken at a time.
  const FlatState s = TwoServerState();
  ZO_ASSERT_OK_AND_ASSIGN(const std::string good, WriteTestCheckpoint(root_, "gpt", 1, s));
  std::ifstream in(good + "/checkpoint.json");
  const nlohmann::json doc = nlohmann::json::parse(in);
  auto expect_error = [&](const char* what, nlohmann::json broken, absl::StatusCode code,
                          const std::string& needle) {
    SCOPED_TRACE(what);
    WriteText(file, broken.dump());
    EXPECT_THAT(ReadCheckpointMeta(dir), StatusIs(code, AllOf(HasSubstr(file), HasSubstr(needle))));
  };
  nlohmann::json j = doc;
  j.erase("chunk_elems");
  expect_error("missing", j, absl::StatusCode::kDataLoss, "\"chunk_elems\" is missing");
  j = doc;
  j["version"] = "one";
  expect_error("wrong type", j, absl::StatusCode::kDataLoss,
               "\"version\" = \"one\" is not an integer");
  j = doc;
  j["parts"][1]["bytes"] = nullptr;
  expect_error("part field", j, absl::StatusCode::kDataLoss, "\"parts[1].bytes\"");
  j = doc;
  j["parts"][0]["index_checksum"] = "xyz";
  expect_error("checksum", j, absl::StatusCode::kDataLoss, "parts[0].index_checksum 'xyz'");
  j = doc;
  j["num_servers"] = 3;
  expect_error("part count", j, absl::StatusCode::kInvalidArgument, "num_servers 3");
  j = doc;
  j["manifest"]["tensors"][0]["shape"] = {1, "x"};
  expect_error("manifest", j, absl::StatusCode::kInvalidArgument, "manifest");
  j = doc;
  j["last_step"] = {{"grad_norm", 1.0}, {"lr", "fast"}, {"skipped", false}};
  expect_error("last step", j, absl::StatusCode::kDataLoss, "\"last_step.lr\" = \"fast\"");
  j = doc;
  j["last_step"] = {{"grad_norm", 1.0},
                    {"lr", 0.1},
                    {"skipped", false},
                    {"group_hyper", {{{"betas", {0.9}}, {"eps", 1e-8}, {"weight_decay", 0}}}}};
  expect_error("group settings", j, absl::StatusCode::kDataLoss,
               "\"last_step.group_hyper\" is not an array of {\"betas\": [b1, b2]");
  j = doc;
  j["init_fingerprint"] = 12345;
  expect_error("fingerprint type", j, absl::StatusCode::kDataLoss,
               "\"init_fingerprint\" = 12345 is not a string");
  j = doc;
  j["init_fingerprint"] = "12345";
  expect_error("fingerprint digits", j, absl::StatusCode::kDataLoss,
               "\"init_fingerprint\" is not 16 hex digits");
  j = doc;
  j["format_version"] = 2;
  expect_error("format", j, absl::StatusCode::kInvalidArgument, "format_version 2");
}

TEST(AtomicFileWriterTest, CommitReplacesAndAnAbandonedWriteLeavesNothing) {
  const std::string dir = FreshTestDir("atomic_file_writer");
  const std::string path = dir + "/out.bin";
  WriteText(path, "old");
  {
    ZO_ASSERT_OK_AND_ASSIGN(auto out, AtomicFileWriter::Create(path));
    ASSERT_THAT(out->Append("new "), IsOk());
    EXPECT_TRUE(fs::exists(path + ".tmp"));
  }
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(fs::file_size(path), 3u);  // still "old"
  {
    ZO_ASSERT_OK_AND_ASSIGN(auto out, AtomicFileWriter::Create(path));
    ASSERT_THAT(out->Append("new "), IsOk());
    ASSERT_THAT(out->Append("contents"), IsOk());
    EXPECT_EQ(out->bytes_written(), 12u);
    ASSERT_THAT(out->Commit(), IsOk());
  }
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(fs::file_size(path), 12u);
  EXPECT_THAT(AtomicFileWriter::Create(dir + "/missing/x"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(dir + "/missing/x.tmp")));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zo
