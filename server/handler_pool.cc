#include "server/handler_pool.h"

#include <utility>

namespace zo {

HandlerPool::~HandlerPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void HandlerPool::Run(std::function<void()> task) {
  std::lock_guard lock(mu_);
  tasks_.push_back(std::move(task));
  // Idle threads each take one queued task; more tasks than that start threads.
  if (static_cast<int>(tasks_.size()) > idle_) {
    threads_.emplace_back([this] { Work(); });
  } else {
    cv_.notify_one();
  }
}

void HandlerPool::Work() {
  std::unique_lock lock(mu_);
  for (;;) {
    ++idle_;
    cv_.wait(lock, [&] { return !tasks_.empty() || stop_; });
    --idle_;
    if (tasks_.empty()) return;  // stopping, nothing left
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // its captures go before the thread may wait again
    lock.lock();
  }
}

}  // namespace zo
