#include "server/state_snapshot.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/checkpoint/checkpoint_test_util.h"
#include "offload/cpu_optimizer.h"
#include "server/state_checkpoint.h"
#include "server/tiered_state_test_fixture.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::CheckpointPattern;
using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

// The shared state (server/tiered_state_test_fixture.h), and a snapshot of it
// that steps may run under.
class StateSnapshotTest : public TieredStateTest {
 protected:
  absl::Status Step() {
    const std::vector<float> grad = CheckpointPattern(elems_, 4);
    AdamHyperParams hp;
    hp.lr = 0.01;
    return state_->AdamStep(MakeAdamStepConstants(hp, 1, 1.0), {grad.data(), DType::kFloat32},
                            {nullptr, DType::kFloat16}, nullptr,
                            snapshot_ ? snapshot_->observer() : nullptr);
  }

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
