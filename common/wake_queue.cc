#include "common/wake_queue.h"

#include <utility>

#include "absl/synchronization/notification.h"

namespace zo {

WakeQueue::WakeQueue() : thread_([this] { Loop(); }) {}

WakeQueue::~WakeQueue() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void WakeQueue::Post(std::vector<std::function<void()>> wakes) {
  if (wakes.empty()) return;
  {
    std::lock_guard lock(mu_);
    for (auto& w : wakes) queue_.push_back(std::move(w));
  }
  cv_.notify_one();
}

void WakeQueue::Drain() {
  absl::Notification done;
  Post({[&done] { done.Notify(); }});
  done.WaitForNotification();
}

void WakeQueue::Loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything posted has run
    std::function<void()> wake = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    wake();
    lock.lock();
  }
}

}  // namespace zo
