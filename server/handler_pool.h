// Threads for the service's unary handlers, which may block (allocating a
// job, checkpoint I/O, a restore across servers): gRPC's callback threads,
// which move every stream of the server, must not. A task starts on an idle
// thread, or on a new one when none is idle, so a handler that waits for
// another call of the same server never waits for a thread. Threads stay
// until the pool is destroyed, which runs the tasks queued and joins them.
#ifndef ZO_SERVER_HANDLER_POOL_H_
#define ZO_SERVER_HANDLER_POOL_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace zo {

class HandlerPool {
 public:
  HandlerPool() = default;
  ~HandlerPool();
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  void Run(std::function<void()> task);

 private:
  void Work();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  int idle_ = 0;
  bool stop_ = false;
};

}  // namespace zo

#endif  // ZO_SERVER_HANDLER_POOL_H_
