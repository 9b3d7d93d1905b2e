#include "worker/train/step_outcomes.h"

#include "gtest/gtest.h"

namespace zo::train {
namespace {

TEST(StepOutcomesTest, NamedStepsComeStraightFromTheReply) {
  StepOutcomes outcomes;
  outcomes.Observe(1, 0, true, 0, 0);
  outcomes.Observe(2, 1, false, 3.5, 1e-3);
  ASSERT_TRUE(outcomes.Get(1).has_value());
  EXPECT_TRUE(outcomes.Get(1)->skipped);
  ASSERT_TRUE(outcomes.Get(2).has_value());
  EXPECT_FALSE(outcomes.Get(2)->skipped);
  EXPECT_EQ(outcomes.Get(2)->grad_norm, 3.5);
  EXPECT_EQ(outcomes.Get(2)->lr, 1e-3);
  EXPECT_FALSE(outcomes.Get(3).has_value());
}

TEST(StepOutcomesTest, AStepNoReplyNamedFollowsFromTheSkipCounter) {
  // Replies at versions 3 and 5: step 4 is never named.
  StepOutcomes skipped4;
  skipped4.Observe(3, 3, false, 1, 1);
  skipped4.Observe(5, 4, false, 1, 1);  // one skip in (3, 5], not step 5
  ASSERT_TRUE(skipped4.Get(4).has_value());
  EXPECT_TRUE(skipped4.Get(4)->skipped);
  EXPECT_FALSE(skipped4.Get(4)->grad_norm.has_value());

  StepOutcomes applied4;
  applied4.Observe(3, 2, true, 1, 1);
  applied4.Observe(5, 3, true, 1, 1);  // the one skip in (3, 5] is step 5
  ASSERT_TRUE(applied4.Get(4).has_value());
  EXPECT_FALSE(applied4.Get(4)->skipped);
}

TEST(StepOutcomesTest, UnknownUntilBothNeighboursAreKnown) {
  StepOutcomes outcomes;
  outcomes.Observe(5, 5, false, 1, 1);
  EXPECT_FALSE(outcomes.Get(3).has_value());
  EXPECT_FALSE(outcomes.Get(4).has_value());  // nothing known at version 3
  outcomes.Observe(3, 3, false, 1, 1);
  ASSERT_TRUE(outcomes.Get(4).has_value());
  EXPECT_FALSE(outcomes.Get(4)->skipped);
}

TEST(StepOutcomesTest, AJumpOfSeveralVersionsIsFilledInWhenTheCountersSayHow) {
  // With DPU a reply after step 8 can name version 6 and the next one 9:
  // steps 7 and 8 are never named and version 7 has no counter.
  StepOutcomes none_skipped;
  none_skipped.Observe(6, 5, false, 1, 1);
  none_skipped.Observe(9, 8, false, 1, 1);
  for (int64_t step : {7, 8}) {
    ASSERT_TRUE(none_skipped.Get(step).has_value()) << step;
    EXPECT_FALSE(none_skipped.Get(step)->skipped) << step;
  }

  StepOutcomes all_skipped;
  all_skipped.Observe(6, 6, false, 1, 1);
  all_skipped.Observe(9, 6, true, 1, 1);  // 7, 8 and 9 skipped (the scale fell)
  for (int64_t step : {7, 8}) {
    ASSERT_TRUE(all_skipped.Get(step).has_value()) << step;
    EXPECT_TRUE(all_skipped.Get(step)->skipped) << step;
  }

  // One of 7 and 8 skipped: which one no reply says.
  StepOutcomes one_of_two;
  one_of_two.Observe(6, 6, false, 1, 1);
  one_of_two.Observe(9, 8, false, 1, 1);
  EXPECT_FALSE(one_of_two.Get(7).has_value());
  EXPECT_FALSE(one_of_two.Get(8).has_value());
  EXPECT_TRUE(one_of_two.Passed(8));
  EXPECT_FALSE(one_of_two.Passed(9));
}

}  // namespace
}  // namespace zo::train
