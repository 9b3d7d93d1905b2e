#include "server/lr_schedule.h"

#include <cmath>
#include <cstdint>
#include <numbers>

#include "common/config.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

// Expected values are written from DeepSpeed's closed forms (it is
// last_batch_iteration, W the warmup steps, T total_num_steps):
//   log warmup     gamma = log(it + 1) / log(W)       it < W
//   linear warmup  gamma = it / W                     it < W
//   WarmupLR       min + (max - min) * gamma, then max
//   WarmupDecayLR  ... then min + (max - min) * max(0, (T - it) / (T - W))
//   WarmupCosineLR lr * (wmr + (1 - wmr) * gamma), then
//                  lr * (cmr + (1 - cmr) * (1 + cos(pi * min(1, (it - W + 1) / (T - W)))) / 2)
// Relative tolerance: a few ulps of the operands.
constexpr double kTol = 1e-15;

SchedulerConfig Scheduler(SchedulerType type, WarmupType warmup, int64_t warmup_steps,
                          int64_t total = 0) {
  SchedulerConfig s;
  s.type = type;
  s.params.warmup_type = warmup;
  s.params.warmup_num_steps = warmup_steps;
  s.params.total_num_steps = total;
  s.params.warmup_min_lr = 0.01;
  s.params.warmup_max_lr = 0.04;
  return s;
}

TEST(LrScheduleTest, ConstantWithoutSchedulerSection) {
  Config config;
  config.optimizer.params.lr = 3e-4;
  const LrSchedule schedule = LrSchedule::FromConfig(config);
  EXPECT_EQ(schedule.kind(), LrSchedule::Kind::kConstant);
  for (int64_t k : {0, 1, 999, 1000000}) EXPECT_EQ(schedule.LrAt(k), 3e-4);
}

TEST(LrScheduleTest, WarmupLRLog) {
  // min 0.01, max 0.04, W = 1000: log(10) / log(1000) = 1/3, log(100) / log(1000) = 2/3.
  const auto s =
      LrSchedule::FromScheduler(Scheduler(SchedulerType::kWarmupLR, WarmupType::kLog, 1000),
                                /*optimizer_lr=*/1.0);
  EXPECT_EQ(s.LrAtIteration(-1), 0.01);  // before the first scheduler step
  EXPECT_EQ(s.LrAtIteration(0), 0.01);   // log(1) = 0
  EXPECT_NEAR(s.LrAtIteration(1), 0.01 + 0.03 * std::log(2.0) / std::log(1000.0), kTol);
  EXPECT_NEAR(s.LrAtIteration(9), 0.02, kTol);
  EXPECT_NEAR(s.LrAtIteration(99), 0.03, kTol);
  EXPECT_NEAR(s.LrAtIteration(999), 0.04, kTol);  // log(1000) / log(1000): warmup ends
  EXPECT_DOUBLE_EQ(s.LrAtIteration(1000), 0.04);
  EXPECT_DOUBLE_EQ(s.LrAtIteration(1000000), 0.04);
}

// The engine steps the optimizer before the scheduler: applied step k runs at
// last_batch_iteration k - 1, the first at the constructor's "not started" value.
TEST(LrScheduleTest, LrAtIsShiftedByOneApplyStep) {
  const auto s =
      LrSchedule::FromScheduler(Scheduler(SchedulerType::kWarmupLR, WarmupType::kLog, 1000), 1.0);
  EXPECT_EQ(s.LrAt(0), 0.01);
  EXPECT_EQ(s.LrAt(1), 0.01);
  EXPECT_NEAR(s.LrAt(10), 0.02, kTol);
  EXPECT_NEAR(s.LrAt(1000), 0.04, kTol);
  for (int64_t k = 0; k < 1100; ++k) ASSERT_EQ(s.LrAt(k), s.LrAtIteration(k - 1)) << k;
}

TEST(LrScheduleTest, WarmupLRLinear) {
  const auto s = LrSchedule::FromScheduler(
      Scheduler(SchedulerType::kWarmupLR, WarmupType::kLinear, 1000), 1.0);
  EXPECT_EQ(s.LrAtIteration(-1), 0.01);
  EXPECT_EQ(s.LrAtIteration(0), 0.01);
  EXPECT_NEAR(s.LrAtIteration(1), 0.01 + 0.03 / 1000, kTol);
  EXPECT_NEAR(s.LrAtIteration(250), 0.0175, kTol);
  EXPECT_NEAR(s.LrAtIteration(500), 0.025, kTol);
  EXPECT_NEAR(s.LrAtIteration(999), 0.01 + 0.03 * 0.999, kTol);  // not yet max
  EXPECT_DOUBLE_EQ(s.LrAtIteration(1000), 0.04);
}

TEST(LrScheduleTest, LogAndLinearDifferMidWarmup) {
  const auto log =
      LrSchedule::FromScheduler(Scheduler(SchedulerType::kWarmupLR, WarmupType::kLog, 1000), 1.0);
  const auto linear = LrSchedule::FromScheduler(
      Scheduler(SchedulerType::kWarmupLR, WarmupType::kLinear, 1000), 1.0);
  // At 9: log 0.02 vs linear 0.01 + 0.03 * 0.009; log is ahead over the whole warmup.
  for (int64_t it = 1; it < 1000; ++it) ASSERT_GT(log.LrAtIteration(it), linear.LrAtIteration(it));
}

TEST(LrScheduleTest, WarmupIsMonotone) {
  for (WarmupType type : {WarmupType::kLog, WarmupType::kLinear}) {
    const auto s = LrSchedule::FromScheduler(Scheduler(SchedulerType::kWarmupLR, type, 1000), 1.0);
    for (int64_t it = 0; it < 1200; ++it) {
      ASSERT_LE(s.LrAtIteration(it - 1), s.LrAtIteration(it)) << it;
      if (it < 999) {  // log reaches max at 999 already, linear at 1000
        ASSERT_LT(s.LrAtIteration(it), s.LrAtIteration(it + 1)) << it;
      }
    }
  }
}

// DeepSpeed clamps warmup_num_steps to 2: with 0, linear gives 0, 1/2, 1.
TEST(LrScheduleTest, WarmupStepsClampedToTwo) {
  const auto s =
      LrSchedule::FromScheduler(Scheduler(SchedulerType::kWarmupLR, WarmupType::kLinear, 0), 1.0);
  EXPECT_EQ(s.LrAtIteration(0), 0.01);
  EXPECT_NEAR(s.LrAtIteration(1), 0.025, kTol);
  EXPECT_DOUBLE_EQ(s.LrAtIteration(2), 0.04);
}

TEST(LrScheduleTest, WarmupDecayLR) {
  // Linear warmup over 100, decay over T - W = 1000 steps to T = 1100.
  const auto s = LrSchedule::FromScheduler(
      Scheduler(SchedulerType::kWarmupDecayLR, WarmupType::kLinear, 100, 1100), 1.0);
  EXPECT_EQ(s.LrAtIteration(-1), 0.01);
  EXPECT_EQ(s.LrAtIteration(0), 0.01);
  EXPECT_NEAR(s.LrAtIteration(50), 0.025, kTol);
  EXPECT_NEAR(s.LrAtIteration(99), 0.01 + 0.03 * 0.99, kTol);
  EXPECT_DOUBLE_EQ(s.LrAtIteration(100), 0.04);       // (1100 - 100) / 1000 = 1
  EXPECT_NEAR(s.LrAtIteration(350), 0.0325, kTol);    // 750 / 1000
  EXPECT_NEAR(s.LrAtIteration(600), 0.025, kTol);     // mid-decay: 1/2
  EXPECT_NEAR(s.LrAtIteration(1099), 0.01003, kTol);  // 1 / 1000
  EXPECT_EQ(s.LrAtIteration(1100), 0.01);             // total: min_lr
  EXPECT_EQ(s.LrAtIteration(5000), 0.01);             // held there
  for (int64_t it = 100; it < 1200; ++it) {
    ASSERT_GE(s.LrAtIteration(it), s.LrAtIteration(it + 1)) << it;
  }
}

TEST(LrScheduleTest, WarmupCosineLR) {
  Config config;
  config.optimizer.params.lr = 0.2;
  config.scheduler = Scheduler(SchedulerType::kWarmupCosineLR, WarmupType::kLog, 100, 1100);
  config.scheduler->params.warmup_min_ratio = 0.1;
  config.scheduler->params.cos_min_ratio = 0.01;
  const LrSchedule s = LrSchedule::FromConfig(config);
  EXPECT_EQ(s.kind(), LrSchedule::Kind::kWarmupCosineLR);

  EXPECT_EQ(s.LrAtIteration(-1), 0.0);          // DeepSpeed's "not started" ratio is 0
  EXPECT_NEAR(s.LrAtIteration(0), 0.02, kTol);  // warmup_min_ratio 0.1 * 0.2
  EXPECT_NEAR(s.LrAtIteration(9), 0.2 * (0.1 + 0.9 * 0.5), kTol);  // log(10) / log(100)
  EXPECT_NEAR(s.LrAtIteration(99), 0.2, kTol);                     // warmup end: ratio 1
  // First cosine step already has progress 1/1000.
  EXPECT_NEAR(s.LrAtIteration(100),
              0.2 * (0.01 + 0.99 * (1 + std::cos(std::numbers::pi / 1000)) / 2), kTol);
  EXPECT_LT(s.LrAtIteration(100), 0.2);
  EXPECT_NEAR(s.LrAtIteration(599), 0.2 * 0.505, kTol);  // progress 1/2: halfway to 0.01
  EXPECT_NEAR(s.LrAtIteration(1099), 0.002, kTol);       // progress 1: cos_min_ratio
  EXPECT_NEAR(s.LrAtIteration(1100), 0.002, kTol);       // total and beyond: held,
  EXPECT_NEAR(s.LrAtIteration(2099), 0.002, kTol);       // never climbing back up
  EXPECT_NEAR(s.LrAtIteration(1000000), 0.002, kTol);

  for (int64_t it = 0; it < 99; ++it) ASSERT_LT(s.LrAtIteration(it), s.LrAtIteration(it + 1));
  for (int64_t it = 99; it < 1200; ++it) ASSERT_GE(s.LrAtIteration(it), s.LrAtIteration(it + 1));
}

TEST(LrScheduleTest, WarmupCosineLRLinearWarmup) {
  SchedulerConfig c = Scheduler(SchedulerType::kWarmupCosineLR, WarmupType::kLinear, 100, 1100);
  c.params.warmup_min_ratio = 0.1;
  c.params.cos_min_ratio = 0.0;
  const auto s = LrSchedule::FromScheduler(c, 0.2);
  EXPECT_NEAR(s.LrAtIteration(50), 0.2 * 0.55, kTol);
  EXPECT_NEAR(s.LrAtIteration(99), 0.2 * 0.991, kTol);  // linear stops short of 1
  EXPECT_NEAR(s.LrAtIteration(599), 0.1, kTol);
  EXPECT_EQ(s.LrAtIteration(1099), 0.0);
}

}  // namespace
}  // namespace zo
