#include "server/handler_pool.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

TEST(HandlerPoolTest, AHandlerWaitingForAnotherNeverWaitsForAThread) {
  // Each task waits for the next one's start: they finish only if all run at
  // once, as handlers of one server that wait on each other's calls do.
  constexpr int kTasks = 16;
  absl::Notification started[kTasks + 1];
  started[kTasks].Notify();
  std::atomic<int> done{0};
  {
    HandlerPool pool;
    for (int i = 0; i < kTasks; ++i) {
      pool.Run([&, i] {
        started[i].Notify();
        started[i + 1].WaitForNotification();
        done.fetch_add(1);
      });
    }
  }  // joins
  EXPECT_EQ(done.load(), kTasks);
}

TEST(HandlerPoolTest, QueuedTasksRunBeforeDestruction) {
  std::atomic<int> ran{0};
  {
    HandlerPool pool;
    absl::Notification release;
    pool.Run([&] { release.WaitForNotification(); });
    for (int i = 0; i < 10; ++i) pool.Run([&] { ran.fetch_add(1); });
    release.Notify();
  }
  EXPECT_EQ(ran.load(), 10);
}

}  // namespace
}  // namespace zo
