// A thread that runs posted callbacks in order, so that whoever posts them
// need not run them where it stands. A server's one WakeQueue runs the
// callbacks WaitLists hand out (a woken push retries, a woken pull starts
// writing) off the lock of the state they waited on; the CUDA backend's runs
// what follows a finished copy, which a CUDA host function may not do.
//
// Thread-safe. Callbacks run in the order posted.
#ifndef ZO_COMMON_WAKE_QUEUE_H_
#define ZO_COMMON_WAKE_QUEUE_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace zo {

class WakeQueue {
 public:
  WakeQueue();
  // Runs everything posted before it, then joins the thread.
  ~WakeQueue();

  // Safe under any lock: only takes the queue's own.
  void Post(std::vector<std::function<void()>> wakes);
  // Returns once everything posted before the call has run. Not from a wake.
  void Drain();

  WakeQueue(const WakeQueue&) = delete;
  WakeQueue& operator=(const WakeQueue&) = delete;

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace zo

#endif  // ZO_COMMON_WAKE_QUEUE_H_
