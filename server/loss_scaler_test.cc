#include "server/loss_scaler.h"

#include <cmath>
#include <vector>

#include "common/config.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using testing::IsOk;
using testing::StatusIs;

constexpr bool G = false;  // a good step
constexpr bool O = true;   // an overflow

LossScalerOptions Dynamic(double initial, int64_t window, int hysteresis, bool consecutive,
                          double min_scale = 1.0) {
  LossScalerOptions o;
  o.mode = LossScaleMode::kDynamic;
  o.initial_scale = initial;
  o.window = window;
  o.hysteresis = hysteresis;
  o.consecutive_hysteresis = consecutive;
  o.min_scale = min_scale;
  return o;
}

// Runs `steps` and returns the scale after each Update, checking that exactly
// the overflow steps are skipped.
std::vector<double> Trace(LossScaler& scaler, const std::vector<bool>& steps) {
  std::vector<double> scales;
  for (bool overflow : steps) {
    EXPECT_EQ(scaler.Update(overflow), overflow);
    scales.push_back(scaler.scale());
  }
  return scales;
}

// Window 3, hysteresis 2, start 16. Worked by hand from the rule "on a good
// step at iteration i, double when (i - last_overflow) % 3 == 0" (last_overflow
// starts at -1) and "an overflow halves only when one hysteresis unit is left,
// else spends one":
//   i  step  (i-L)  hyst before->after   scale after
//   0   G      1        2                    16
//   1   G      2        2                    16
//   2   G      3        2 (refill)           32   first doubling: 3 good steps
//   3   O      -        2 -> 1               32   absorbed by hysteresis; L = 3
//   4   O      -        1                    16   budget spent: halve; L = 4
//   5   G      1        1 (no refill)        16
//   6   G      2        1                    16
//   7   O      -        1                     8   still spent: halves at once; L = 7
//   8   G      1        1                     8
//   9   G      2        1                     8
//  10   G      3        1 -> 2 (refill)      16   doubling refills the budget
//  11   O      -        2 -> 1               16   absorbed again; L = 11
//  12   G      1        1                    16
//  13   G      2        1                    16
//  14   G      3        1 -> 2               32
const std::vector<bool> kTrace = {G, G, G, O, O, G, G, O, G, G, G, O, G, G, G};

TEST(LossScalerTest, HandTraceWindow3Hysteresis2) {
  LossScaler scaler(Dynamic(16, 3, 2, /*consecutive=*/false));
  EXPECT_EQ(scaler.scale(), 16);
  EXPECT_THAT(Trace(scaler, kTrace),
              ::testing::ElementsAre(16, 16, 32, 32, 16, 16, 16, 8, 8, 8, 16, 16, 16, 16, 32));
  EXPECT_EQ(
      scaler.state(),
      (LossScalerState{
          .scale = 32, .iteration = 15, .last_overflow_iteration = 11, .hysteresis_left = 2}));
}

// The same steps with consecutive_hysteresis: every good step refills the
// budget to 2, so the lone overflows at i = 7 and i = 11 are absorbed instead
// of halving (i = 7 is where the two traces part: 16 here, 8 above). The
// doublings still come at (i - L) == 3: i = 2, 10, 14.
TEST(LossScalerTest, HandTraceConsecutiveHysteresis) {
  LossScaler scaler(Dynamic(16, 3, 2, /*consecutive=*/true));
  EXPECT_THAT(Trace(scaler, kTrace),
              ::testing::ElementsAre(16, 16, 32, 32, 16, 16, 16, 16, 16, 16, 32, 32, 32, 32, 64));
  EXPECT_EQ(scaler.state().hysteresis_left, 2);
}

TEST(LossScalerTest, HysteresisOneHalvesOnEveryOverflow) {
  LossScaler scaler(Dynamic(64, 1000, 1, false));
  EXPECT_THAT(Trace(scaler, {O, O, O}), ::testing::ElementsAre(32, 16, 8));
}

// Start 16, floor 3, hysteresis 1: 16 -> 8 -> 4 -> max(2, 3) = 3, then it stays
// at the floor and every overflow is still skipped. Window 2 after the last
// overflow (L = 4): good steps at i = 5 (i-L = 1) and i = 6 (2: doubles to 6).
TEST(LossScalerTest, MinLossScaleFloor) {
  LossScaler scaler(Dynamic(16, 2, 1, false, /*min_scale=*/3));
  EXPECT_THAT(Trace(scaler, {O, O, O, O, O, G, G}), ::testing::ElementsAre(8, 4, 3, 3, 3, 3, 6));
}

// Window 1000 from a clean start: iterations 0..998 leave the scale alone, the
// 1000th good step (iteration 999, 999 - (-1) = 1000) doubles it, and the next
// doubling is 1000 steps later.
TEST(LossScalerTest, DoublesOnceEveryWindowOfCleanSteps) {
  LossScaler scaler(Dynamic(65536, 1000, 2, false));
  for (int step = 1; step <= 2000; ++step) {
    ASSERT_FALSE(scaler.Update(false));
    const double expected = step < 1000 ? 65536 : step < 2000 ? 131072 : 262144;
    ASSERT_EQ(scaler.scale(), expected) << "after step " << step;
  }
}

// After an overflow at iteration L the window restarts: it takes `window` more
// good steps (L+1 .. L+window) to double.
TEST(LossScalerTest, OverflowRestartsTheWindow) {
  LossScaler scaler(Dynamic(1024, 4, 1, false));
  ASSERT_TRUE(scaler.Update(true));  // i = 0: 512, L = 0
  EXPECT_THAT(Trace(scaler, {G, G, G, G, G}), ::testing::ElementsAre(512, 512, 512, 1024, 1024));
}

TEST(LossScalerTest, FromConfigFp16Dynamic) {
  Config config;
  config.fp16.enabled = true;
  config.fp16.initial_scale_power = 12;
  config.fp16.loss_scale_window = 7;
  config.fp16.hysteresis = 3;
  config.fp16.consecutive_hysteresis = true;
  config.fp16.min_loss_scale = 0.5;
  LossScaler scaler = LossScaler::FromConfig(config);
  EXPECT_EQ(scaler.options(), Dynamic(4096, 7, 3, true, 0.5));
  EXPECT_EQ(
      scaler.state(),
      (LossScalerState{
          .scale = 4096, .iteration = 0, .last_overflow_iteration = -1, .hysteresis_left = 3}));
}

TEST(LossScalerTest, FromConfigDefaultFp16StartsAt2To16) {
  Config config;
  config.fp16.enabled = true;
  EXPECT_EQ(LossScaler::FromConfig(config).scale(), 65536);
}

TEST(LossScalerTest, StaticScaleNeverMovesButOverflowSkips) {
  Config config;
  config.fp16.enabled = true;
  config.fp16.loss_scale = 128;
  LossScaler scaler = LossScaler::FromConfig(config);
  EXPECT_EQ(scaler.options().mode, LossScaleMode::kStatic);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(scaler.Update(true));
    EXPECT_EQ(scaler.scale(), 128);
  }
  for (int i = 0; i < 3000; ++i) ASSERT_FALSE(scaler.Update(false));
  EXPECT_EQ(scaler.scale(), 128);
}

TEST(LossScalerTest, Bf16AndFp32HaveNoScalingAndNeverSkip) {
  Config bf16;
  bf16.bf16.enabled = true;
  Config fp32;
  for (const Config& config : {bf16, fp32}) {
    LossScaler scaler = LossScaler::FromConfig(config);
    EXPECT_EQ(scaler.options().mode, LossScaleMode::kNone);
    EXPECT_EQ(scaler.scale(), 1);
    EXPECT_FALSE(scaler.Update(true));
    for (int i = 0; i < 2000; ++i) scaler.Update(false);
    EXPECT_EQ(scaler.scale(), 1);
  }
}

TEST(LossScalerTest, RestoredStateContinuesIdentically) {
  LossScaler original(Dynamic(16, 3, 2, false));
  Trace(original, {G, G, G, O});
  LossScaler restored(Dynamic(16, 3, 2, false));
  ASSERT_THAT(restored.Restore(original.state()), IsOk());
  const std::vector<bool> rest = {O, G, G, O, G, G, G};
  EXPECT_EQ(Trace(restored, rest), Trace(original, rest));
  EXPECT_EQ(restored.state(), original.state());
}

TEST(LossScalerTest, RestoreRejectsImpossibleStates) {
  LossScaler scaler(Dynamic(16, 3, 2, false));
  const LossScalerState good{
      .scale = 8, .iteration = 5, .last_overflow_iteration = 4, .hysteresis_left = 1};
  ASSERT_THAT(scaler.Restore(good), IsOk());

  LossScalerState s = good;
  s.scale = 0;
  EXPECT_THAT(scaler.Restore(s), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("scale")));
  s.scale = std::nan("");
  EXPECT_THAT(scaler.Restore(s), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("scale")));
  s = good;
  s.iteration = -1;
  EXPECT_THAT(scaler.Restore(s),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("iteration = -1")));
  s = good;
  s.last_overflow_iteration = 5;
  EXPECT_THAT(scaler.Restore(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("last_overflow_iteration = 5")));
  s.last_overflow_iteration = -2;
  EXPECT_THAT(scaler.Restore(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("last_overflow_iteration = -2")));
  s = good;
  s.hysteresis_left = 3;
  EXPECT_THAT(scaler.Restore(s),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hysteresis_left = 3")));
  EXPECT_EQ(scaler.state(), good);  // failed restores change nothing

  Config config;
  config.fp16.enabled = true;
  config.fp16.loss_scale = 128;
  LossScaler fixed = LossScaler::FromConfig(config);
  s = fixed.state();
  s.scale = 64;
  EXPECT_THAT(fixed.Restore(s),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fixed at 128")));
}

}  // namespace
}  // namespace zo
