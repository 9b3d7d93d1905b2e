#include "server/state_snapshot.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/checkpoint/checkpoint_test_util.h"
#include "offload/cpu_optimizer.h"
#include "offload/io/direct_file.h"
#include "offload/io/io_test_util.h"
#include "offload/thread_pool.h"
#include "server/state_checkpoint.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::CheckpointPattern;
using ::zo::testing::IsOk;
using ::zo::testing::ScopedTempDir;
using ::zo::testing::StatusIs;

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Server 0 of 2 with chunks of 7000 elements, over a state of sub-groups of
// 10 000 of which 2 are in RAM: chunk, sub-group and tile (16 384) borders
// all fall in different places.
class StateSnapshotTest : public ::testing::Test {
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
    master_ = CheckpointPattern(elems_, 1);
    m_ = CheckpointPattern(elems_, 2);
    v_ = CheckpointPattern(elems_, 3);
    for (float& x : v_) x = x * x;  // Adam's v is never negative
    ASSERT_THAT(state_->WriteState(0, master_, m_, v_), IsOk());
    // The state as it is now, written the stopping way.
    ASSERT_THAT(WriteStatePart(*state_, chunks_, *map_, dir_.File("reference.zop")).status(),
                IsOk());
  }

  absl::Status Step() {
    const std::vector<float> grad = CheckpointPattern(elems_, 4);
    AdamHyperParams hp;
    hp.lr = 0.01;
    return state_->AdamStep(MakeAdamStepConstants(hp, 1, 1.0), {grad.data(), DType::kFloat32},
                            {nullptr, DType::kFloat16}, nullptr,
                            snapshot_ ? snapshot_->observer() : nullptr);
  }

  ScopedTempDir dir_;
  ThreadPool pool_{2};
  std::unique_ptr<ShardMap> map_;
  std::vector<LocalChunk> chunks_;
  int64_t elems_ = 0;
  std::unique_ptr<TieredOptimizerState> state_;
  std::vector<float> master_, m_, v_;
  std::unique_ptr<StateSnapshot> snapshot_;
};

// Part of RAM captured between steps, the rest by two steps that change
// everything, their hook's copies staged while buffers last and written by
// the hook itself past that: the part is the state before them, byte for
// byte.
TEST_F(StateSnapshotTest, StepsDuringTheSnapshotLeaveItAtItsVersion) {
  // Two staging buffers of one tile: some tiles are staged, the others
  // written by the hook.
  auto staging = std::make_shared<SnapshotStaging>(2 * 3 * 16384 * 4, 3 * 16384);
  ZO_ASSERT_OK_AND_ASSIGN(snapshot_,
                          StateSnapshot::Begin(dir_.File("part.zop"), chunks_, *map_, 3, staging));
  ZO_ASSERT_OK_AND_ASSIGN(const bool more, snapshot_->CaptureSomeFromRam(*state_, 3000));
  EXPECT_TRUE(more);
  EXPECT_FALSE(snapshot_->complete());
  EXPECT_THAT(snapshot_->Finish().status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not captured yet")));

  ASSERT_THAT(Step(), IsOk());
  EXPECT_FALSE(snapshot_->complete()) << "staged copies wait for the writer";
  ASSERT_THAT(snapshot_->WriteStaged(), IsOk());
  EXPECT_TRUE(snapshot_->complete());
  EXPECT_EQ(staging->held_bytes(), 2 * 3 * 16384 * 4) << "both buffers were used and kept";
  ASSERT_THAT(Step(), IsOk());
  std::vector<float> now(elems_);
  ASSERT_THAT(state_->ReadState(0, absl::MakeSpan(now), {}, {}), IsOk());
  EXPECT_NE(now, master_) << "the steps should have changed the state";

  ASSERT_THAT(snapshot_->CaptureRest(*state_), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const CheckpointPartSummary summary, snapshot_->Finish());
  EXPECT_EQ(summary.file, "part.zop");
  EXPECT_TRUE(FileBytes(dir_.File("part.zop")) == FileBytes(dir_.File("reference.zop")));
}

// No step comes: the RAM sub-groups are read, the NVMe ones go through one
// observe pass (every sub-group read once), and the part is the same.
TEST_F(StateSnapshotTest, WithoutStepsTheRestIsCapturedByOneObservePass) {
  ZO_ASSERT_OK_AND_ASSIGN(snapshot_,
                          StateSnapshot::Begin(dir_.File("part.zop"), chunks_, *map_, 3));
  const SwapIoStats before = state_->swap_io_stats();
  ASSERT_THAT(snapshot_->CaptureRest(*state_), IsOk());
  const SwapIoStats after = state_->swap_io_stats();
  EXPECT_EQ(after.reads - before.reads, state_->nvme_sub_groups());
  ASSERT_THAT(snapshot_->Finish().status(), IsOk());
  EXPECT_TRUE(FileBytes(dir_.File("part.zop")) == FileBytes(dir_.File("reference.zop")));
  // The state itself is untouched.
  std::vector<float> master(elems_), m(elems_), v(elems_);
  ASSERT_THAT(state_->ReadState(0, absl::MakeSpan(master), absl::MakeSpan(m), absl::MakeSpan(v)),
              IsOk());
  EXPECT_EQ(master, master_);
  EXPECT_EQ(v, v_);
}

TEST_F(StateSnapshotTest, AnAbortedSnapshotFailsItsFinishAndLeavesNoFile) {
  ZO_ASSERT_OK_AND_ASSIGN(snapshot_,
                          StateSnapshot::Begin(dir_.File("part.zop"), chunks_, *map_, 3));
  snapshot_->Abort(absl::AbortedError("restored to version 1"));
  EXPECT_TRUE(snapshot_->complete());
  ASSERT_THAT(Step(), IsOk());  // the hook does nothing any more
  EXPECT_THAT(snapshot_->Finish().status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("restored to version 1")));
  snapshot_.reset();
  EXPECT_FALSE(std::filesystem::exists(dir_.File("part.zop")));
}

// The version before the snapshot's rides along: its lease holds the next
// update off until CapturePrevious has written it, and an abort lets it go.
TEST_F(StateSnapshotTest, ThePreviousVersionHoldsTheNextUpdateOffUntilWritten) {
  ZO_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ParamVersions> versions,
                          ParamVersions::Create(elems_, DType::kFloat16));
  auto write_version = [&](int64_t version) {
    auto* out = static_cast<uint16_t*>(versions->BeginWrite());
    for (int64_t i = 0; i < elems_; ++i) out[i] = static_cast<uint16_t>(version * 7 + i);
    versions->CommitWrite(version);
  };
  write_version(1);
  write_version(2);
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease lease, versions->Acquire(1));
  ZO_ASSERT_OK_AND_ASSIGN(snapshot_,
                          StateSnapshot::Begin(dir_.File("part.zop"), chunks_, *map_, 2, nullptr,
                                               StateSnapshot::Previous{std::move(lease), 2}));
  ASSERT_THAT(snapshot_->CaptureRest(*state_), IsOk());
  EXPECT_FALSE(snapshot_->complete());
  EXPECT_THAT(snapshot_->Finish().status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("previous version")));

  // Update 3 writes the buffer of version 1: it waits for the snapshot.
  const int64_t blocked = versions->times_blocked();
  std::thread update([&] { write_version(3); });
  while (versions->times_blocked() == blocked) std::this_thread::yield();
  ASSERT_THAT(snapshot_->CapturePrevious(), IsOk());
  update.join();
  EXPECT_THAT(snapshot_->CapturePrevious(), IsOk()) << "a second call has nothing to do";
  ASSERT_THAT(snapshot_->Finish().status(), IsOk());

  ZO_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointPartReader::Open(dir_.File("part.zop")));
  EXPECT_EQ(reader->previous_bytes(), 2u);
  for (const LocalChunk& c : chunks_) {
    std::vector<uint16_t> got(c.elems);
    ASSERT_THAT(reader->ReadPrevious(c.id, 0, c.elems, got.data()), IsOk());
    for (int64_t i = 0; i < c.elems; ++i) {
      ASSERT_EQ(got[i], static_cast<uint16_t>(7 + c.local_offset + i)) << "chunk " << c.id;
    }
  }

  // Aborted before it was written: the lease goes at once.
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease lease2, versions->Acquire(2));
  ZO_ASSERT_OK_AND_ASSIGN(snapshot_,
                          StateSnapshot::Begin(dir_.File("part2.zop"), chunks_, *map_, 3, nullptr,
                                               StateSnapshot::Previous{std::move(lease2), 2}));
  snapshot_->Abort(absl::AbortedError("restored"));
  ASSERT_THAT(versions->Reset(9), IsOk());  // would wait for the lease for ever
  EXPECT_THAT(snapshot_->CapturePrevious(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("restored")));
}

}  // namespace
}  // namespace zo
