#include "worker/client/internal/byte_budget.h"

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace zo::client_internal {
namespace {

TEST(ByteBudgetTest, AcquireWaitsForRelease) {
  ByteBudget budget(100);
  budget.Acquire(1, 60);
  std::atomic<bool> acquired{false};
  std::thread t([&] {
    budget.Acquire(1, 60);
    acquired = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(acquired);
  budget.Release(1, 60);
  t.join();
  EXPECT_TRUE(acquired);
  EXPECT_EQ(budget.in_flight(), 60);
}

TEST(ByteBudgetTest, APieceLargerThanTheLimitPassesAlone) {
  ByteBudget budget(10);
  budget.Acquire(1, 1000);
  EXPECT_EQ(budget.in_flight(), 1000);
  budget.Release(1, 1000);
  EXPECT_EQ(budget.in_flight(), 0);
}

TEST(ByteBudgetTest, OlderStepsAreNotHeldBackByNewerOnes) {
  ByteBudget budget(100);
  budget.Acquire(2, 100);  // step 2's bytes, stuck at a server waiting for step 1
  budget.Acquire(1, 100);  // must not wait on them
  EXPECT_EQ(budget.in_flight(), 200);
  std::atomic<bool> acquired{false};
  std::thread t([&] {
    budget.Acquire(2, 10);  // step 2 counts step 1's bytes too
    acquired = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(acquired);
  budget.Release(1, 100);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(acquired);  // step 2 is still full by itself
  budget.Release(2, 100);
  t.join();
  EXPECT_TRUE(acquired);
}

}  // namespace
}  // namespace zo::client_internal
