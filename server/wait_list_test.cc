#include "server/wait_list.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/wake_queue.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

std::vector<int> RunAll(std::vector<std::function<void()>> wakes, std::vector<int>* log) {
  for (auto& w : wakes) w();
  return *log;
}

TEST(WaitListTest, TakesByKeyAndRemovesByTicket) {
  WaitList list;
  std::vector<int> log;
  list.Add(3, [&] { log.push_back(3); });
  const WaitList::Ticket five = list.Add(5, [&] { log.push_back(5); });
  const WaitList::Ticket four = list.Add(4, [&] { log.push_back(4); });
  EXPECT_NE(five, WaitList::kNone);
  EXPECT_EQ(list.size(), 3);

  EXPECT_EQ(RunAll(list.TakeUpTo(2), &log), std::vector<int>{});
  EXPECT_EQ(RunAll(list.TakeUpTo(4), &log), (std::vector<int>{3, 4}));
  EXPECT_FALSE(list.Remove(four)) << "taken wakes cannot be removed";
  EXPECT_TRUE(list.Remove(five));
  EXPECT_FALSE(list.Remove(five));
  EXPECT_EQ(list.size(), 0);
  EXPECT_TRUE(list.TakeAll().empty());
}

TEST(WaitListTest, TicketsAreNeverReused) {
  WaitList list;
  const WaitList::Ticket a = list.Add(0, [] {});
  list.TakeAll();
  const WaitList::Ticket b = list.Add(0, [] {});
  EXPECT_NE(a, b);
  EXPECT_FALSE(list.Remove(a)) << "a stale ticket must not remove a newer waiter";
  EXPECT_EQ(list.size(), 1);
}

TEST(WakeQueueTest, RunsInOrderOffTheCallerAndDrainsOnDestruction) {
  std::vector<std::string> log;
  std::atomic<bool> on_caller{false};
  const std::thread::id caller = std::this_thread::get_id();
  absl::Notification gate;
  {
    WakeQueue queue;
    queue.Post({[&] {
      gate.WaitForNotification();
      on_caller = std::this_thread::get_id() == caller;
      log.push_back("a");
    }});
    queue.Post({[&] { log.push_back("b"); }, [&] { log.push_back("c"); }});
    queue.Post({});
    gate.Notify();
  }  // destruction runs everything posted
  EXPECT_EQ(log, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_FALSE(on_caller);
}

TEST(WakeQueueTest, DrainReturnsAfterEverythingPostedBeforeIt) {
  WakeQueue queue;
  absl::Notification gate;
  std::atomic<int> ran{0};
  queue.Post({[&] {
    gate.WaitForNotification();
    ++ran;
  }});
  queue.Post({[&] { ++ran; }});
  std::thread opener([&] { gate.Notify(); });
  queue.Drain();
  EXPECT_EQ(ran.load(), 2);
  opener.join();
}

}  // namespace
}  // namespace zo
