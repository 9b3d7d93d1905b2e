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

}  // namespace
}  // namespace zo::train
