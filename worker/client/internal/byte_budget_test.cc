#include "worker/client/internal/byte_budget.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace zo::client_internal {
namespace {

// Spins until `budget` has seen more than `seen` blocked Acquires, or `done`.
void WaitForAnotherBlock(const ByteBudget& budget, int64_t seen, const std::atomic<bool>& done) {
  while (budget.times_blocked() <= seen && !done) std::this_thread::yield();
}

TEST(ByteBudgetTest, AcquireWaitsForRelease) {
  ByteBudget budget(100);
  budget.Acquire(1, 60);
  std::atomic<bool> acquired{false};
  std::thread t([&] {
    budget.Acquire(1, 60);
    acquired = true;
  });
  WaitForAnotherBlock(budget, 0, acquired);
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
  EXPECT_EQ(budget.times_blocked(), 0);
  budget.Release(1, 1000);
  EXPECT_EQ(budget.in_flight(), 0);
}

TEST(ByteBudgetTest, OlderStepsAreNotHeldBackByNewerOnes) {
  ByteBudget budget(100);
  budget.Acquire(2, 100);  // step 2's bytes, stuck at a server waiting for step 1
  budget.Acquire(1, 100);  // must not wait on them
  EXPECT_EQ(budget.in_flight(), 200);
  EXPECT_EQ(budget.times_blocked(), 0);
  std::atomic<bool> acquired{false};
  std::thread t([&] {
    budget.Acquire(2, 10);  // step 2 counts step 1's bytes too
    acquired = true;
  });
  WaitForAnotherBlock(budget, 0, acquired);
  EXPECT_FALSE(acquired);
  const int64_t blocked = budget.times_blocked();
  budget.Release(1, 100);
  // The waiter wakes, looks again and goes back to sleep: step 2 is still
  // full by itself.
  WaitForAnotherBlock(budget, blocked, acquired);
  EXPECT_FALSE(acquired);
  budget.Release(2, 100);
  t.join();
  EXPECT_TRUE(acquired);
}

}  // namespace
}  // namespace zo::client_internal
