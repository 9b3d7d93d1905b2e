// The optimizer state the checkpoint-part tests (state_snapshot_test,
// own_checkpoint_part_test) take apart: server 0 of 2 with chunks of 7000
// elements over a state of sub-groups of 10 000, two of them in RAM and the
// rest on NVMe, so that chunk, sub-group and tile (16 384) borders all fall
// in different places. It holds known patterns, also written the stopping
// way to reference.zop for parts to be compared with byte for byte.
#ifndef ZO_SERVER_TIERED_STATE_TEST_FIXTURE_H_
#define ZO_SERVER_TIERED_STATE_TEST_FIXTURE_H_

#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "common/sharding.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "offload/checkpoint/checkpoint_test_util.h"
#include "offload/io/direct_file.h"
#include "offload/io/io_test_util.h"
#include "offload/thread_pool.h"
#include "offload/tier/tiered_state.h"
#include "server/gradient_accumulator.h"
#include "server/state_checkpoint.h"

namespace zo {

class TieredStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (absl::Status direct = CheckDirectIo(dir_.path()); !direct.ok()) {
      GTEST_SKIP() << "O_DIRECT unsupported under " << dir_.path() << ": " << direct;
    }
    map_ = std::make_unique<ShardMap>(
        *ShardMap::Create({{.name = "w", .shape = {100'003}, .dtype = DType::kFloat16}}, 7000, 2));
    int64_t offset = 0;
    for (int64_t c : map_->ChunksOfServer(0)) {
      chunks_.push_back({.id = c, .local_offset = offset, .elems = map_->ChunkRange(c).size()});
      offset += chunks_.back().elems;
    }
    elems_ = offset;
    TieredStateOptions options;
    options.swap_dir = dir_.File("swap");
    options.sub_group_elems = 10'000;
    options.ram_budget_bytes = 2 * 10'000 * 12;
    ZO_ASSERT_OK_AND_ASSIGN(state_, TieredOptimizerState::Create(options, elems_, &pool_));
    ASSERT_GT(state_->nvme_sub_groups(), 0);
    master_ = testing::CheckpointPattern(elems_, 1);
    m_ = testing::CheckpointPattern(elems_, 2);
    v_ = testing::CheckpointPattern(elems_, 3);
    for (float& x : v_) x = x * x;  // Adam's v is never negative
    ASSERT_THAT(state_->WriteState(0, master_, m_, v_), testing::IsOk());
    ASSERT_THAT(WriteStatePart(*state_, chunks_, *map_, dir_.File("reference.zop")).status(),
                testing::IsOk());
  }

  static std::string FileBytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  testing::ScopedTempDir dir_;
  ThreadPool pool_{2};
  std::unique_ptr<ShardMap> map_;
  std::vector<LocalChunk> chunks_;
  int64_t elems_ = 0;
  std::unique_ptr<TieredOptimizerState> state_;
  std::vector<float> master_, m_, v_;  // the state as SetUp wrote it
};

}  // namespace zo

#endif  // ZO_SERVER_TIERED_STATE_TEST_FIXTURE_H_
