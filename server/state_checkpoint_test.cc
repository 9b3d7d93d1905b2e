#include "server/state_checkpoint.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/fp16.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/checkpoint/checkpoint_test_util.h"
#include "offload/thread_pool.h"
#include "server/lr_schedule.h"

namespace zo {
namespace {

using testing::IsOk;

const std::vector<TensorSpec> kManifest = {
    {.name = "a", .shape = {25}, .dtype = DType::kFloat16},
    {.name = "b", .shape = {5, 6}, .dtype = DType::kFloat16}};

// The chunks `server` owns, laid out back to back as Job does.
std::vector<LocalChunk> ChunksOf(const ShardMap& map, int server) {
  std::vector<LocalChunk> chunks;
  int64_t offset = 0;
  for (int64_t c : map.ChunksOfServer(server)) {
    chunks.push_back({.id = c, .local_offset = offset, .elems = map.ChunkRange(c).size()});
    offset += chunks.back().elems;
  }
  return chunks;
}

int64_t ElemsOf(const std::vector<LocalChunk>& chunks) {
  int64_t n = 0;
  for (const LocalChunk& c : chunks) n += c.elems;
  return n;
}

// Distinct values per array and flat index, exact in fp32 and in fp16.
float Master(int64_t flat) { return 0.25f * static_cast<float>(flat) - 3.0f; }
float M(int64_t flat) { return 1000.0f + static_cast<float>(flat); }
float V(int64_t flat) { return 2.0f * static_cast<float>(flat); }

class StateCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::FreshTestDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::unique_ptr<TieredOptimizerState> NewState(int64_t elems) {
    absl::StatusOr<std::unique_ptr<TieredOptimizerState>> s =
        TieredOptimizerState::Create(TieredStateOptions{}, elems, &pool_);
    EXPECT_THAT(s.status(), IsOk());
    return s.ok() ? *std::move(s) : nullptr;
  }

  // A committed checkpoint of version 7 written by 2 servers in chunks of 10.
  std::string WriteTwoServerCheckpoint() {
    const ShardMap map = *ShardMap::Create(kManifest, 10, 2);
    absl::StatusOr<std::string> dir = BeginCheckpoint(root_, "st", 7);
    EXPECT_THAT(dir.status(), IsOk());
    CheckpointMeta meta;
    meta.job = "st";
    meta.version = 7;
    meta.applied_steps = 6;
    meta.manifest = kManifest;
    meta.chunk_elems = 10;
    meta.num_servers = 2;
    meta.dp_world_size = 1;
    meta.config_json = "{}";
    for (int server = 0; server < 2; ++server) {
      const std::vector<LocalChunk> chunks = ChunksOf(map, server);
      std::unique_ptr<TieredOptimizerState> state = NewState(ElemsOf(chunks));
      for (const LocalChunk& c : chunks) {
        std::vector<float> master, m, v;
        for (int64_t k = map.ChunkRange(c.id).begin; k < map.ChunkRange(c.id).end; ++k) {
          master.push_back(Master(k));
          m.push_back(M(k));
          v.push_back(V(k));
        }
        EXPECT_THAT(state->WriteState(c.local_offset, master, m, v), IsOk());
      }
      absl::StatusOr<CheckpointPartSummary> part =
          WriteStatePart(*state, chunks, map, *dir + "/" + CheckpointPartFileName(server));
      EXPECT_THAT(part.status(), IsOk());
      meta.parts.push_back(*part);
    }
    absl::StatusOr<std::string> path = CommitCheckpoint(*dir, meta);
    EXPECT_THAT(path.status(), IsOk());
    return *path;
  }

  ThreadPool pool_{2};
  std::string root_;
};

// Written by 2 servers in chunks of 10, loaded by server 1 of 3 in chunks of 7.
TEST_F(StateCheckpointTest, APartLoadsIntoAnotherServerLayout) {
  const std::string path = WriteTwoServerCheckpoint();
  ZO_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(path));
  const ShardMap map = *ShardMap::Create(kManifest, 7, 3);
  const std::vector<LocalChunk> chunks = ChunksOf(map, 1);
  const int64_t n = ElemsOf(chunks);
  std::unique_ptr<TieredOptimizerState> state = NewState(n);
  std::vector<uint16_t> low(static_cast<size_t>(n));
  ASSERT_THAT(LoadStatePart(*reader, chunks, map, *state, low.data(), DType::kFloat16), IsOk());
  for (const LocalChunk& c : chunks) {
    std::vector<float> master(c.elems), m(c.elems), v(c.elems);
    ASSERT_THAT(state->ReadState(c.local_offset, absl::MakeSpan(master), absl::MakeSpan(m),
                                 absl::MakeSpan(v)),
                IsOk());
    for (int64_t k = 0; k < c.elems; ++k) {
      const int64_t flat = map.ChunkRange(c.id).begin + k;
      EXPECT_EQ(master[k], Master(flat)) << flat;
      EXPECT_EQ(m[k], M(flat)) << flat;
      EXPECT_EQ(v[k], V(flat)) << flat;
      EXPECT_EQ(low[c.local_offset + k], FloatToHalfBits(Master(flat))) << flat;
    }
  }
}

TEST_F(StateCheckpointTest, SameManifestComparesNamesAndShapes) {
  std::vector<TensorSpec> other = kManifest;
  EXPECT_TRUE(SameManifest(kManifest, other));
  other[1].dtype = DType::kBFloat16;  // the dtype follows the config, not the checkpoint
  EXPECT_TRUE(SameManifest(kManifest, other));
  other[1].shape = {6, 5};
  EXPECT_FALSE(SameManifest(kManifest, other));
  other.pop_back();
  EXPECT_FALSE(SameManifest(kManifest, other));
}

TEST(LastStepOfTest, StoredValuesWinAndOldCheckpointsDeriveTheLr) {
  ZO_ASSERT_OK_AND_ASSIGN(
      LoadedConfig loaded,
      ParseConfig(R"({"train_batch_size": 1, "scheduler": {"type": "WarmupLR", "params": {
          "warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 10,
          "warmup_type": "linear"}}})"));
  CheckpointMeta meta;
  meta.version = 5;
  meta.applied_steps = 4;
  LastStep old = LastStepOf(meta, loaded.config);
  EXPECT_TRUE(old.derived);
  EXPECT_EQ(old.grad_norm, 0.0);
  EXPECT_EQ(old.lr, LrSchedule::FromConfig(loaded.config).LrAt(3));
  EXPECT_GT(old.lr, 0.0);
  meta.applied_steps = 0;
  EXPECT_EQ(LastStepOf(meta, loaded.config).lr, 0.0);

  meta.has_last_step = true;
  meta.last_grad_norm = std::numeric_limits<double>::quiet_NaN();
  meta.last_lr = 0.004;
  meta.last_skipped = true;
  const LastStep stored = LastStepOf(meta, loaded.config);
  EXPECT_FALSE(stored.derived);
  EXPECT_TRUE(std::isnan(stored.grad_norm));
  EXPECT_EQ(stored.lr, 0.004);
  EXPECT_TRUE(stored.skipped);
}

}  // namespace
}  // namespace zo
