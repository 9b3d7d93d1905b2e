// OwnCheckpointPart over a real optimizer state (RAM and NVMe sub-groups)
// and real part files: a part finished on its own thread while a step runs
// holds the state of its version byte for byte; parts ended by a drop or a
// later begin cannot be finished; a bad previous-version request changes
// nothing.
#include "server/own_checkpoint_part.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/checkpoint/checkpoint_dir.h"
#include "offload/checkpoint/checkpoint_test_util.h"
#include "offload/cpu_optimizer.h"
#include "server/tiered_state_test_fixture.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::CheckpointPattern;
using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

// The shared state (server/tiered_state_test_fixture.h) and a part of its
// checkpoints.
class OwnCheckpointPartTest : public TieredStateTest {
 protected:
  void SetUp() override {
    TieredStateTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ZO_ASSERT_OK_AND_ASSIGN(versions_, ParamVersions::Create(elems_, DType::kFloat16));
    part_ = std::make_unique<OwnCheckpointPart>(
        OwnCheckpointPart::Options{.job = "gpt", .server_index = 0, .dtype = DType::kFloat16},
        *map_, chunks_, *state_, lock_);
  }

  absl::Status Begin(int64_t version, const std::string& dir, uint32_t previous_bytes = 0) {
    std::filesystem::create_directories(dir);
    std::lock_guard hold(lock_.mutex());
    return part_->BeginLocked(version, dir, previous_bytes, *versions_);
  }

  // A step as the job's step thread runs one, with the part's hooks.
  absl::Status Step() {
    JobStateLock::ForStep hold(lock_);
    part_->BeforeUpdateLocked();
    const std::vector<float> grad = CheckpointPattern(elems_, 4);
    AdamHyperParams hp;
    hp.lr = 0.01;
    return state_->AdamStep(MakeAdamStepConstants(hp, 1, 1.0), {grad.data(), DType::kFloat32},
                            {nullptr, DType::kFloat16}, nullptr, part_->ObserverLocked());
  }

  std::string PartIn(const std::string& dir) const {
    return (std::filesystem::path(dir) / CheckpointPartFileName(0)).string();
  }

  std::unique_ptr<ParamVersions> versions_;
  JobStateLock lock_;
  std::unique_ptr<OwnCheckpointPart> part_;
};

// The finish captures RAM between steps and lets a step carry the NVMe
// part; whichever way the two interleave, the part is the state it began
// at, byte for byte, and the step changed the state.
TEST_F(OwnCheckpointPartTest, APartFinishedWhileAStepRunsHoldsItsVersion) {
  const std::string dir = dir_.File("step-00000003.tmp");
  ASSERT_THAT(Begin(3, dir), IsOk());
  absl::StatusOr<v1::WriteCheckpointPartResponse> written;
  std::thread finisher([&] { written = part_->Finish(3, dir, absl::Seconds(60)); });
  ASSERT_THAT(Step(), IsOk());
  finisher.join();
  ASSERT_THAT(written.status(), IsOk());
  EXPECT_EQ(written->file(), CheckpointPartFileName(0));
  EXPECT_EQ(written->bytes(), static_cast<int64_t>(FileBytes(PartIn(dir)).size()));
  EXPECT_EQ(written->index_checksum().size(), 16u);
  EXPECT_TRUE(FileBytes(PartIn(dir)) == FileBytes(dir_.File("reference.zop")));
  std::vector<float> master(elems_);
  ASSERT_THAT(state_->ReadState(0, absl::MakeSpan(master), {}, {}), IsOk());
  EXPECT_NE(master, master_) << "the step should have changed the state";
  // Finished: a second finish finds none.
  EXPECT_THAT(part_->Finish(3, dir, absl::ZeroDuration()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no checkpoint part")));
}

TEST_F(OwnCheckpointPartTest, APartEndedByADropOrALaterBeginCannotBeFinished) {
  const std::string dir = dir_.File("step-00000003.tmp");
  EXPECT_THAT(part_->Finish(3, dir, absl::ZeroDuration()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("server 0 has no checkpoint part of version 3")));
  ASSERT_THAT(Begin(3, dir), IsOk());
  {
    std::lock_guard hold(lock_.mutex());
    part_->DropLocked(absl::AbortedError("restored to version 1"));
  }
  EXPECT_THAT(part_->Finish(3, dir, absl::ZeroDuration()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no checkpoint part")));
  EXPECT_FALSE(std::filesystem::exists(PartIn(dir)));

  // A lead that died left one begun; the next checkpoint's begin ends it.
  const std::string other = dir_.File("step-00000004.tmp");
  ASSERT_THAT(Begin(3, dir), IsOk());
  ASSERT_THAT(Begin(4, other), IsOk());
  EXPECT_THAT(part_->Finish(3, dir, absl::ZeroDuration()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no checkpoint part")));
  EXPECT_FALSE(std::filesystem::exists(PartIn(dir)));
  ZO_ASSERT_OK_AND_ASSIGN(const v1::WriteCheckpointPartResponse written,
                          part_->Finish(4, other, absl::ZeroDuration()));
  EXPECT_TRUE(FileBytes(PartIn(other)) == FileBytes(dir_.File("reference.zop")));
}

// The previous version in another element size than the job serves, or one
// the server no longer holds: refused, and no part is under way after.
TEST_F(OwnCheckpointPartTest, APreviousVersionItCannotCarryIsRefused) {
  const std::string dir = dir_.File("step-00000003.tmp");
  EXPECT_THAT(Begin(3, dir, /*previous_bytes=*/4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("previous version in 4-byte elements; job gpt serves fp16")));
  EXPECT_THAT(Begin(3, dir, /*previous_bytes=*/2),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("needs the weights of version 2 on server 0")));
  EXPECT_THAT(part_->Finish(3, dir, absl::ZeroDuration()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no checkpoint part")));
  EXPECT_FALSE(std::filesystem::exists(PartIn(dir)));
}

}  // namespace
}  // namespace zo
