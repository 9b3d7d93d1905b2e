#include "worker/train/step_abort.h"

#include "gtest/gtest.h"

namespace zo::train {
namespace {

TEST(StepAbortTest, TrippingCancelsWhatIsRegisteredAndKeepsTheFirstReason) {
  StepAbort abort;
  PullCancellation in_flight, joined;
  abort.Register(&in_flight);
  abort.Register(&joined);
  abort.Unregister(&joined);
  EXPECT_TRUE(abort.reason().ok());
  EXPECT_FALSE(in_flight.cancelled());

  abort.Trip(absl::UnavailableError("pipeline stage 0 is gone"));
  abort.Trip(absl::UnavailableError("later"));
  EXPECT_TRUE(in_flight.cancelled());
  EXPECT_FALSE(joined.cancelled()) << "no longer registered";
  EXPECT_EQ(abort.reason(), absl::UnavailableError("pipeline stage 0 is gone"));
}

TEST(StepAbortTest, APrefetchStartedAfterTheTripIsCancelledAtOnce) {
  StepAbort abort;
  abort.Trip(absl::UnavailableError("gone"));
  PullCancellation late;
  abort.Register(&late);
  EXPECT_TRUE(late.cancelled());
  abort.Unregister(&late);
}

}  // namespace
}  // namespace zo::train
