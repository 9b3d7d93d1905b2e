// StepRecord: the loss scale a pull of each version gets (the newest kept,
// the oldest for anything older), what a step and a restore leave, and
// what a checkpoint and JobStatus carry of it.
#include "server/step_record.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::ElementsAre;

v1::StepCommit Commit(int64_t step, double next_scale, bool skip = false) {
  v1::StepCommit c;
  c.set_step(step);
  c.set_next_loss_scale(next_scale);
  c.set_skip(skip);
  c.set_applied_steps(skip ? step - 1 : step);
  c.set_grad_norm(0.5 * static_cast<double>(step));
  c.set_lr(1e-3 * static_cast<double>(step));
  c.add_group_lr(1e-3 * static_cast<double>(step));
  c.add_group_lr(0.0);
  return c;
}

TEST(StepRecordTest, EachVersionGetsTheScaleItsStepLeftAndOnlyTheNewestAreKept) {
  StepRecord record(65536.0);
  EXPECT_EQ(record.ScaleFor(0), 65536.0);
  for (int64_t step = 1; step <= 20; ++step) record.Record(Commit(step, 1000.0 + step));
  EXPECT_EQ(record.ScaleFor(20), 1020.0);
  EXPECT_EQ(record.ScaleFor(13), 1013.0);
  // Versions 1..12 are gone: the oldest kept answers for them.
  EXPECT_EQ(record.ScaleFor(12), 1013.0);
  EXPECT_EQ(record.ScaleFor(0), 1013.0);
  // A version not yet recorded reads the newest scale before it.
  EXPECT_EQ(record.ScaleFor(25), 1020.0);
  record.SetScale(21, 512.0);  // the update of step 21 is writing it
  EXPECT_EQ(record.ScaleFor(21), 512.0);
}

TEST(StepRecordTest, ASkippedStepKeepsTheLastAppliedRatesAndShowsItsNormAndSkip) {
  StepRecord record(1024.0);
  record.Record(Commit(1, 1024.0));
  record.Record(Commit(2, 512.0, /*skip=*/true));
  v1::JobStatus status;
  record.AddTo(status, 2);
  EXPECT_EQ(status.applied_steps(), 1);
  EXPECT_EQ(status.loss_scale(), 512.0);
  EXPECT_EQ(status.last_grad_norm(), 1.0);
  EXPECT_TRUE(status.last_skipped());
  EXPECT_EQ(status.last_lr(), 1e-3);
  CheckpointMeta meta;
  record.Describe(meta);
  EXPECT_TRUE(meta.has_last_step);
  EXPECT_TRUE(meta.last_skipped);
  EXPECT_EQ(meta.last_lr, 1e-3);
  EXPECT_THAT(meta.last_group_lr, ElementsAre(1e-3, 0.0));
}

TEST(StepRecordTest, ARestoreBringsBackTheCheckpointsScalesAndLastStep) {
  StepRecord record(1024.0);
  for (int64_t step = 1; step <= 5; ++step) record.Record(Commit(step, 100.0 * step));
  CheckpointMeta meta;
  meta.version = 9;
  meta.applied_steps = 8;
  meta.loss_scale = 4096.0;
  meta.previous_loss_scale = 8192.0;
  meta.last_group_lr = {0.25, 0.5};
  const LastStep last{.grad_norm = 3.0, .lr = 0.25, .skipped = false};
  record.Restore(meta, last, /*keeps_previous=*/true);
  EXPECT_EQ(record.ScaleFor(9), 4096.0);
  EXPECT_EQ(record.ScaleFor(8), 8192.0);
  EXPECT_EQ(record.ScaleFor(5), 8192.0);  // nothing older survives a restore
  EXPECT_EQ(record.applied_steps(), 8);
  CheckpointMeta again;
  record.Describe(again);
  EXPECT_EQ(again.last_grad_norm, 3.0);
  EXPECT_THAT(again.last_group_lr, ElementsAre(0.25, 0.5));

  record.Restore(meta, last, /*keeps_previous=*/false);
  EXPECT_EQ(record.ScaleFor(8), 4096.0);
}

}  // namespace
}  // namespace zo
