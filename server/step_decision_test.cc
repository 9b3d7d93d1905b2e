#include "server/step_decision.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/loss_scaler.h"

namespace zo {
namespace {

using ::testing::AllOf;
using ::testing::DoubleNear;
using ::testing::HasSubstr;
using testing::IsOk;
using testing::StatusIs;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A config with a batch size every dp in these tests divides, plus `body`.
absl::StatusOr<LoadedConfig> Parse(const std::string& body, int dp = 1) {
  return ParseConfig(
      absl::StrCat(R"({"train_batch_size": 24)", body.empty() ? "" : ", ", body, "}"),
      {.dp_world_size = dp});
}

// Relative closeness for values computed with a different association.
::testing::Matcher<double> Near(double expected) {
  return DoubleNear(expected, 1e-12 * std::abs(expected));
}

// DeepSpeed ZeRO's `_unscale_and_clip_grads` with the norm that feeds it, for
// gradients that our servers SUM over the dp ranks where DeepSpeed's
// all-reduce AVERAGES them:
//
//   combined_scale = loss_scale
//   if clip_grad > 0:
//     clip = ((total_norm / loss_scale) + 1e-6) / clip_grad
//     if clip > 1: combined_scale = clip * loss_scale
//   grads *= 1 / combined_scale
struct Reference {
  double multiplier;  // for the summed gradients
  double norm;        // of the averaged, unscaled gradient
};

Reference DeepSpeedReference(const std::vector<double>& chunk_sum_squares, int dp,
                             double loss_scale, double clip_grad) {
  double sum = 0;
  for (double s : chunk_sum_squares) sum += s;
  // DeepSpeed's total_norm: of the averaged gradient, still loss-scaled.
  const double total_norm = std::sqrt(sum) / dp;
  double combined_scale = loss_scale;
  if (clip_grad > 0.0) {
    const double clip = ((total_norm / loss_scale) + 1e-6) / clip_grad;
    if (clip > 1) combined_scale = clip * loss_scale;
  }
  // DeepSpeed's 1 / combined_scale applies to the average; the sum needs / dp.
  return {(1.0 / combined_scale) / dp, total_norm / loss_scale};
}

// Chunk sums of squares of summed, scaled gradients whose averaged, unscaled
// norm is `norm`, spread unevenly over three chunks.
std::vector<double> SumsForNorm(double norm, int dp, double loss_scale) {
  const double total = std::pow(norm * dp * loss_scale, 2);
  return {0.2 * total, 0.5 * total, 0.3 * total};
}

TEST(StepDecisionTest, ClippingMatchesDeepSpeed) {
  for (int dp : {1, 2, 3, 8}) {
    for (double loss_scale : {1.0, 1024.0, 65536.0}) {
      for (double clip_grad : {1.0, 0.3}) {
        ZO_ASSERT_OK_AND_ASSIGN(
            LoadedConfig loaded,
            Parse(absl::StrCat(R"("gradient_clipping": )", clip_grad,
                               R"(, "fp16": {"enabled": true, "loss_scale": )", loss_scale, "}"),
                  dp));
        StepDecider decider(loaded.config, dp);
        int64_t applied = 0;
        for (double norm : {0.0, 1e-3, 0.29, 0.3, 0.31, 1.0, 5.0, 1e4}) {
          SCOPED_TRACE(absl::StrCat("dp ", dp, " loss_scale ", loss_scale, " clip ", clip_grad,
                                    " norm ", norm));
          const std::vector<double> sums = SumsForNorm(norm, dp, loss_scale);
          const StepDecision d = decider.Decide(sums, /*non_finite=*/false, loss_scale);
          const Reference ref = DeepSpeedReference(sums, dp, loss_scale, clip_grad);
          EXPECT_FALSE(d.skip);
          EXPECT_THAT(d.grad_multiplier, Near(ref.multiplier));
          EXPECT_THAT(d.grad_norm, Near(ref.norm));
          EXPECT_THAT(d.grad_norm, Near(norm));
          EXPECT_EQ(d.lr, 1e-3) << "no scheduler: optimizer.params.lr";
          EXPECT_EQ(d.applied_steps, ++applied);
          EXPECT_EQ(d.loss_scale_used, loss_scale);
          EXPECT_EQ(d.next_loss_scale, loss_scale) << "static scale";
          // What the optimizer then sees: the averaged, unscaled gradient,
          // shrunk to the clip norm (less DeepSpeed's 1e-6) when above it.
          double total = 0;
          for (double s : sums) total += s;
          const double applied_norm = std::sqrt(total) * d.grad_multiplier;
          const double expected_norm =
              norm + 1e-6 > clip_grad ? norm * clip_grad / (norm + 1e-6) : norm;
          EXPECT_THAT(applied_norm, DoubleNear(expected_norm, 1e-12 * (1 + expected_norm)));
          EXPECT_LE(applied_norm, clip_grad * (1 + 1e-12));
        }
      }
    }
  }
}

TEST(StepDecisionTest, ClippingOffOnlyUnscalesAndAverages) {
  for (int dp : {1, 4}) {
    ZO_ASSERT_OK_AND_ASSIGN(
        LoadedConfig loaded,
        Parse(R"("gradient_clipping": 0, "fp16": {"enabled": true, "loss_scale": 512})", dp));
    StepDecider decider(loaded.config, dp);
    for (double norm : {0.0, 0.5, 1.0, 1e6}) {
      const std::vector<double> sums = SumsForNorm(norm, dp, 512);
      const StepDecision d = decider.Decide(sums, false, 512);
      EXPECT_FALSE(d.skip);
      EXPECT_EQ(d.grad_multiplier, 1.0 / (512.0 * dp)) << "norm " << norm;
      EXPECT_THAT(d.grad_multiplier, Near(DeepSpeedReference(sums, dp, 512, 0).multiplier));
      EXPECT_THAT(d.grad_norm, Near(norm));
    }
  }
}

TEST(StepDecisionTest, NonFiniteSkipsWithoutAdvancing) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, Parse(""));
  StepDecider decider(loaded.config, 2);
  ASSERT_FALSE(decider.Decide({1.0, 2.0}, false, 1.0).skip);
  ASSERT_FALSE(decider.Decide({1.0, 2.0}, false, 1.0).skip);
  ASSERT_EQ(decider.applied_steps(), 2);

  struct Case {
    std::vector<double> sums;
    bool flag;
    bool norm_finite;
  };
  const Case cases[] = {
      {{1.0, 2.0}, true, true},     // a chunk flagged Inf/NaN in its gradients
      {{1.0, kInf}, false, false},  // the sums themselves overflowed
      {{kNaN, 2.0}, false, false},
      {{kInf, kNaN}, true, false},
  };
  for (const Case& c : cases) {
    const StepDecision d = decider.Decide(c.sums, c.flag, 1.0);
    EXPECT_TRUE(d.skip);
    EXPECT_EQ(d.lr, 0.0);
    EXPECT_EQ(d.grad_multiplier, 0.0);
    EXPECT_EQ(d.applied_steps, 2);
    EXPECT_EQ(std::isfinite(d.grad_norm), c.norm_finite);
    EXPECT_EQ(d.next_loss_scale, 1.0) << "fp32 has no loss scaling";
  }
  EXPECT_EQ(decider.applied_steps(), 2);
  const StepDecision d = decider.Decide({1.0, 2.0}, false, 1.0);
  EXPECT_FALSE(d.skip);
  EXPECT_EQ(d.applied_steps, 3);
  EXPECT_EQ(decider.applied_steps(), 3);
}

std::string LinearWarmup(int64_t warmup_num_steps) {
  return absl::StrCat(R"("scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.01, )",
                      R"("warmup_max_lr": 0.11, "warmup_type": "linear", "warmup_num_steps": )",
                      warmup_num_steps, "}}");
}

// DeepSpeed's WarmupLR (linear) as the engine drives it: the constructor sets
// warmup_min_lr, and lr_scheduler.step() runs after each APPLIED
// optimizer.step(), so the step with k applied steps before it runs at
// get_lr(last_batch_iteration = k - 1) = min + (max - min) * min(1, (k-1)/warmup).
double ExpectedWarmupLr(int64_t applied_before, int64_t warmup_num_steps) {
  const double min_lr = 0.01;
  const double max_lr = 0.11;
  if (applied_before == 0) return min_lr;
  const double gamma = std::min(
      1.0, static_cast<double>(applied_before - 1) / static_cast<double>(warmup_num_steps));
  return min_lr + (max_lr - min_lr) * gamma;
}

TEST(StepDecisionTest, LrScheduleStepsOnlyOnAppliedSteps) {
  constexpr int64_t kWarmup = 5;
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, Parse(LinearWarmup(kWarmup)));
  StepDecider decider(loaded.config, 1);
  const std::vector<bool> overflows = {false, true, false, true,  true,  false, false,
                                       false, true, false, false, false, false};
  int64_t applied = 0;
  for (size_t i = 0; i < overflows.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("step ", i));
    const StepDecision d = decider.Decide({0.25}, overflows[i], 1.0);
    EXPECT_EQ(d.skip, overflows[i]);
    if (overflows[i]) {
      EXPECT_EQ(d.lr, 0.0);
      EXPECT_EQ(d.applied_steps, applied);
      continue;
    }
    EXPECT_THAT(d.lr, Near(ExpectedWarmupLr(applied, kWarmup)));
    EXPECT_THAT(d.lr, Near(LrSchedule::FromConfig(loaded.config).LrAt(applied)));
    EXPECT_EQ(d.applied_steps, ++applied);
  }
  EXPECT_EQ(applied, 9);  // 13 steps, 4 overflows
  // The first two applied steps run at warmup_min_lr; after the warmup, max.
  EXPECT_EQ(ExpectedWarmupLr(0, kWarmup), 0.01);
  EXPECT_EQ(ExpectedWarmupLr(1, kWarmup), 0.01);
  EXPECT_THAT(decider.Decide({0.25}, false, 1.0).lr, Near(0.11));
}

constexpr char kDynamicFp16[] =
    R"("fp16": {"enabled": true, "initial_scale_power": 4, "hysteresis": 2, )"
    R"("loss_scale_window": 3})";

// Scale 16, window 3, hysteresis 2, by DeepSpeed's DynamicLossScaler rule
// (see server/loss_scaler.h): an overflow spends a hysteresis unit, or halves
// once the budget is down to 1, and restarts the window; a good step at
// iteration i doubles when (i - last_overflow) % 3 == 0, refilling the budget.
//   i  step  used  hyst       next
//   0   O     16   2 -> 1      16   L = 0
//   1   G     16   1           16   (1 - 0) % 3
//   2   G     16   1           16
//   3   G     16   1 -> 2      32   (3 - 0) % 3 == 0: double, refill
//   4   O     32   2 -> 1      32   L = 4
//   5   O     32   1           16   halve; L = 5
//   6   O     16   1            8   halve; L = 6
//   7   G      8   1            8
//   8   G      8   1            8
//   9   G      8   1 -> 2      16
TEST(StepDecisionTest, DynamicLossScaleStepByStep) {
  constexpr int kDp = 2;
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, Parse(kDynamicFp16, kDp));
  StepDecider decider(loaded.config, kDp);
  EXPECT_EQ(decider.scaler().scale(), 16);
  const std::vector<bool> steps = {true, false, false, false, true,
                                   true, true,  false, false, false};
  const double used[] = {16, 16, 16, 16, 32, 32, 16, 8, 8, 8};
  const double next[] = {16, 16, 16, 32, 32, 16, 8, 8, 8, 16};
  const int64_t applied[] = {0, 1, 2, 3, 3, 3, 3, 4, 5, 6};
  for (size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("step ", i));
    const double scale = decider.scaler().scale();
    ASSERT_EQ(scale, used[i]);
    const std::vector<double> sums = SumsForNorm(0.5, kDp, scale);
    const StepDecision d = decider.Decide(sums, steps[i], scale);
    EXPECT_EQ(d.skip, steps[i]);
    EXPECT_EQ(d.loss_scale_used, used[i]);
    EXPECT_EQ(d.next_loss_scale, next[i]);
    EXPECT_EQ(decider.scaler().scale(), next[i]);
    EXPECT_EQ(d.applied_steps, applied[i]);
    EXPECT_EQ(decider.applied_steps(), applied[i]);
    if (steps[i]) {
      EXPECT_EQ(d.grad_multiplier, 0.0);
      EXPECT_EQ(d.lr, 0.0);
    } else {
      EXPECT_THAT(d.grad_multiplier, Near(DeepSpeedReference(sums, kDp, used[i], 1.0).multiplier));
      EXPECT_THAT(d.grad_multiplier, Near(1.0 / (used[i] * kDp))) << "norm 0.5 is not clipped";
      EXPECT_EQ(d.lr, 1e-3);
    }
  }
}

// DeepSpeed's DynamicLossScaler.update_scale, transcribed.
struct DeepSpeedDynamicScaler {
  double cur_scale;
  int64_t scale_window;
  int delayed_shift;
  bool consecutive_hysteresis;
  double min_scale = 1.0;
  int64_t cur_iter = 0;
  int64_t last_overflow_iter = -1;
  int cur_hysteresis = delayed_shift;

  void UpdateScale(bool overflow) {
    if (overflow) {
      if (delayed_shift == 1 || cur_hysteresis == 1) {
        cur_scale = std::max(cur_scale / 2, min_scale);
      } else {
        cur_hysteresis -= 1;
      }
      last_overflow_iter = cur_iter;
    } else {
      if (consecutive_hysteresis) cur_hysteresis = delayed_shift;
      if ((cur_iter - last_overflow_iter) % scale_window == 0) {
        if (!consecutive_hysteresis) cur_hysteresis = delayed_shift;
        cur_scale *= 2;
      }
    }
    cur_iter += 1;
  }
};

TEST(StepDecisionTest, DynamicLossScaleRandomMatchesDeepSpeed) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, Parse(kDynamicFp16));
  StepDecider decider(loaded.config, 1);
  DeepSpeedDynamicScaler ds{
      .cur_scale = 16, .scale_window = 3, .delayed_shift = 2, .consecutive_hysteresis = false};
  std::mt19937 rng(7);
  int64_t applied = 0;
  for (int i = 0; i < 500; ++i) {
    SCOPED_TRACE(absl::StrCat("step ", i));
    const bool overflow = std::bernoulli_distribution(0.3)(rng);
    const double scale = decider.scaler().scale();
    ASSERT_EQ(scale, ds.cur_scale);
    const StepDecision d = decider.Decide({1.0}, overflow, scale);
    ds.UpdateScale(overflow);
    if (!overflow) ++applied;
    ASSERT_EQ(d.skip, overflow);
    ASSERT_EQ(d.next_loss_scale, ds.cur_scale);
    ASSERT_EQ(d.applied_steps, applied);
  }
}

TEST(StepDecisionTest, StaticLossScaleSkipsOverflowButNeverMoves) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded,
                          Parse(R"("fp16": {"enabled": true, "loss_scale": 128})"));
  StepDecider decider(loaded.config, 1);
  for (bool overflow : {false, true, true, true, false, false, false, false}) {
    const StepDecision d = decider.Decide({4.0}, overflow, 128);
    EXPECT_EQ(d.skip, overflow);
    EXPECT_EQ(d.next_loss_scale, 128);
  }
  EXPECT_EQ(decider.applied_steps(), 5);
}

TEST(StepDecisionTest, Bf16NeverChangesScale) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, Parse(R"("bf16": {"enabled": true})", 4));
  StepDecider decider(loaded.config, 4);
  EXPECT_EQ(decider.scaler().scale(), 1.0);
  for (bool overflow : {false, true, true, true, false, false, false, false, true, false}) {
    const StepDecision d = decider.Decide({4.0, 5.0}, overflow, decider.scaler().scale());
    EXPECT_EQ(d.skip, overflow) << "a non-finite step is skipped in bf16 too";
    EXPECT_EQ(d.loss_scale_used, 1.0);
    EXPECT_EQ(d.next_loss_scale, 1.0);
    EXPECT_EQ(decider.scaler().scale(), 1.0);
  }
  EXPECT_EQ(decider.applied_steps(), 6);
}

// Dynamic scale 2^2 with min 1 and hysteresis 1: overflows halve it to the
// floor in two steps; only skips at the floor count towards the limit.
TEST(StepDecisionTest, FailsAfterMaxConsecutiveSkipsAtMinScale) {
  ZO_ASSERT_OK_AND_ASSIGN(
      LoadedConfig loaded,
      Parse(R"("fp16": {"enabled": true, "initial_scale_power": 2, "hysteresis": 1,
                        "min_loss_scale": 1}, "zo": {"max_consecutive_skips": 3})"));
  StepDecider decider(loaded.config, 1);
  // 4 -> 2 -> 1: not at the floor yet.
  EXPECT_EQ(decider.Decide({1.0}, true, 4).stuck_skips, 0);
  EXPECT_EQ(decider.Decide({1.0}, true, 2).stuck_skips, 0);
  EXPECT_EQ(decider.scaler().scale(), 1.0);
  // At the floor: 1, 2, then an applied step starts the count again.
  EXPECT_EQ(decider.Decide({1.0}, true, 1).stuck_skips, 1);
  EXPECT_EQ(decider.Decide({1.0}, true, 1).stuck_skips, 2);
  StepDecision d = decider.Decide({1.0}, false, 1);
  EXPECT_FALSE(d.skip);
  EXPECT_EQ(d.stuck_skips, 0);
  EXPECT_THAT(d.failure, IsOk());
  for (int i = 1; i < 3; ++i) {
    d = decider.Decide({1.0}, true, 1);
    EXPECT_EQ(d.stuck_skips, i);
    EXPECT_THAT(d.failure, IsOk());
  }
  d = decider.Decide({1.0}, true, 1);
  EXPECT_TRUE(d.skip);
  EXPECT_EQ(d.stuck_skips, 3);
  EXPECT_THAT(
      d.failure,
      StatusIs(absl::StatusCode::kFailedPrecondition,
               AllOf(HasSubstr("3 consecutive steps"), HasSubstr("loss scale 1 "),
                     HasSubstr("fp16.min_loss_scale"), HasSubstr("zo.max_consecutive_skips = 3"))));
}

TEST(StepDecisionTest, ZeroMaxConsecutiveSkipsNeverFails) {
  ZO_ASSERT_OK_AND_ASSIGN(
      LoadedConfig loaded,
      Parse(R"("bf16": {"enabled": true}, "zo": {"max_consecutive_skips": 0})"));
  StepDecider decider(loaded.config, 1);
  for (int i = 1; i <= 1000; ++i) {
    const StepDecision d = decider.Decide({1.0}, true, 1);
    ASSERT_EQ(d.stuck_skips, i);
    ASSERT_THAT(d.failure, IsOk());
  }
}

TEST(StepDecisionTest, DefaultFailsBf16AfterHundredNonFiniteSteps) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, Parse(R"("bf16": {"enabled": true})"));
  EXPECT_EQ(loaded.config.zo.max_consecutive_skips, 100);
  StepDecider decider(loaded.config, 1);
  for (int i = 1; i < 100; ++i) ASSERT_THAT(decider.Decide({kNaN}, false, 1).failure, IsOk());
  EXPECT_THAT(
      decider.Decide({kNaN}, false, 1).failure,
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no loss scaling without fp16")));
}

std::string FullConfig() {
  return absl::StrCat(kDynamicFp16, R"(, "gradient_clipping": 0.5, )", LinearWarmup(10));
}

void ExpectSameDecision(const StepDecision& a, const StepDecision& b) {
  // Bitwise equal, NaN included.
  EXPECT_EQ(a.skip, b.skip);
  EXPECT_EQ(std::bit_cast<uint64_t>(a.grad_multiplier), std::bit_cast<uint64_t>(b.grad_multiplier));
  EXPECT_EQ(std::bit_cast<uint64_t>(a.lr), std::bit_cast<uint64_t>(b.lr));
  EXPECT_EQ(a.applied_steps, b.applied_steps);
  EXPECT_EQ(std::bit_cast<uint64_t>(a.loss_scale_used), std::bit_cast<uint64_t>(b.loss_scale_used));
  EXPECT_EQ(std::bit_cast<uint64_t>(a.next_loss_scale), std::bit_cast<uint64_t>(b.next_loss_scale));
  EXPECT_EQ(std::bit_cast<uint64_t>(a.grad_norm), std::bit_cast<uint64_t>(b.grad_norm));
}

// The caller sums chunk statistics in chunk order; given the same sums the
// decision is a pure function of them and the decider's state.
TEST(StepDecisionTest, Deterministic) {
  constexpr int kDp = 3;
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, Parse(FullConfig(), kDp));
  StepDecider a(loaded.config, kDp);
  StepDecider b(loaded.config, kDp);
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> sum(0.0, 1e7);
  for (int i = 0; i < 200; ++i) {
    SCOPED_TRACE(absl::StrCat("step ", i));
    std::vector<double> sums(17);
    for (double& s : sums) s = sum(rng);
    const bool overflow = std::bernoulli_distribution(0.2)(rng);
    if (std::bernoulli_distribution(0.05)(rng)) sums[3] = kNaN;
    ExpectSameDecision(a.Decide(sums, overflow, a.scaler().scale()),
                       b.Decide(sums, overflow, b.scaler().scale()));
    ASSERT_EQ(a.scaler().state(), b.scaler().state());
  }
}

TEST(StepDecisionTest, RestoreResumesScheduleAndScaler) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, Parse(FullConfig()));
  StepDecider decider(loaded.config, 1);
  const LossScalerState state{
      .scale = 64, .iteration = 10, .last_overflow_iteration = 8, .hysteresis_left = 1};
  ASSERT_THAT(decider.Restore(7, state), IsOk());
  EXPECT_EQ(decider.applied_steps(), 7);
  EXPECT_EQ(decider.scaler().state(), state);

  // i = 10: (10 - 8) % 3 != 0, no doubling.
  StepDecision d = decider.Decide({1.0}, false, 64);
  EXPECT_FALSE(d.skip);
  EXPECT_THAT(d.lr, Near(ExpectedWarmupLr(7, 10)));
  EXPECT_EQ(d.applied_steps, 8);
  EXPECT_EQ(d.next_loss_scale, 64);
  // i = 11: overflow with one hysteresis unit left halves.
  d = decider.Decide({1.0}, true, 64);
  EXPECT_TRUE(d.skip);
  EXPECT_EQ(d.applied_steps, 8);
  EXPECT_EQ(d.next_loss_scale, 32);
  // i = 12: the schedule resumes where it stopped.
  d = decider.Decide({1.0}, false, 32);
  EXPECT_THAT(d.lr, Near(ExpectedWarmupLr(8, 10)));
  EXPECT_EQ(d.applied_steps, 9);
}

TEST(StepDecisionTest, RestoredDeciderContinuesLikeTheOriginal) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, Parse(FullConfig()));
  StepDecider original(loaded.config, 1);
  std::mt19937 rng(3);
  for (int i = 0; i < 23; ++i) {
    original.Decide({2.0}, std::bernoulli_distribution(0.3)(rng), original.scaler().scale());
  }
  StepDecider restored(loaded.config, 1);
  ASSERT_THAT(restored.Restore(original.applied_steps(), original.scaler().state()), IsOk());
  for (int i = 0; i < 30; ++i) {
    SCOPED_TRACE(absl::StrCat("step ", i));
    const bool overflow = std::bernoulli_distribution(0.3)(rng);
    ExpectSameDecision(original.Decide({2.0}, overflow, original.scaler().scale()),
                       restored.Decide({2.0}, overflow, restored.scaler().scale()));
  }
}

TEST(StepDecisionTest, InvalidRestoreChangesNothing) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, Parse(FullConfig()));
  StepDecider decider(loaded.config, 1);
  decider.Decide({1.0}, false, 16);
  decider.Decide({1.0}, true, 16);
  const LossScalerState before = decider.scaler().state();
  const LossScalerState valid{
      .scale = 64, .iteration = 10, .last_overflow_iteration = 8, .hysteresis_left = 1};
  EXPECT_THAT(decider.Restore(-1, valid),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("applied_steps")));
  LossScalerState bad = valid;
  bad.hysteresis_left = 5;
  EXPECT_THAT(decider.Restore(3, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hysteresis_left")));
  bad = valid;
  bad.scale = kInf;
  EXPECT_THAT(decider.Restore(3, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("scale")));
  EXPECT_EQ(decider.applied_steps(), 1);
  EXPECT_EQ(decider.scaler().state(), before);
}

}  // namespace
}  // namespace zo
