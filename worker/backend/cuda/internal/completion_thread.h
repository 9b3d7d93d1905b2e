// Runs callbacks that CUDA host functions hand over, on a thread of its own:
// a host function (cudaLaunchHostFunc) may not call CUDA, and what a
// transfer's `done` does next (free a tensor, push bytes that may block on a
// full network window) must not stall the stream's later host functions.
#ifndef ZO_WORKER_BACKEND_CUDA_INTERNAL_COMPLETION_THREAD_H_
#define ZO_WORKER_BACKEND_CUDA_INTERNAL_COMPLETION_THREAD_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace zo::backend::cuda {

class CompletionThread {
 public:
  CompletionThread();
  // Runs what is queued, then joins.
  ~CompletionThread();

  // Thread-safe and never blocks on the callbacks (fit for a host function).
  void Post(std::function<void()> fn);

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::thread thread_;
};

}  // namespace zo::backend::cuda

#endif  // ZO_WORKER_BACKEND_CUDA_INTERNAL_COMPLETION_THREAD_H_
