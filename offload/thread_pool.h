// A fixed set of worker threads for the CPU optimizer step: created once,
// woken once per step, each worker running the same function on its own index
// so that it updates a fixed, disjoint range (shared-nothing, STYLE.md).
//
//   ThreadPool pool;  // all cores
//   pool.RunOnAll([&](int worker) { Update(ranges[worker]); });
//
// The calling thread runs worker 0 itself, so a pool of n workers owns n - 1
// threads and a pool of 1 runs everything inline.
#ifndef ZO_OFFLOAD_THREAD_POOL_H_
#define ZO_OFFLOAD_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace zo {

// Thread-safe: RunOnAll may be called from any thread; concurrent calls are
// serialized (one runs at a time). `fn` must not call RunOnAll on the same
// pool (it would deadlock) and must not throw. Destroying the pool while a
// RunOnAll is in progress is undefined; destroying an idle pool joins every
// thread.
class ThreadPool {
 public:
  // `num_workers` <= 0 means std::thread::hardware_concurrency() (at least 1).
  explicit ThreadPool(int num_workers = 0);
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return num_workers_; }

  // Runs fn(w) once for every w in [0, size()), w = 0 on the calling thread,
  // and returns when all have returned. Everything the workers wrote is
  // visible to the caller afterwards, and everything the caller wrote before
  // the call is visible to the workers.
  void RunOnAll(const std::function<void(int worker)>& fn);

  // The worker count used when none is given: hardware_concurrency(), >= 1.
  static int DefaultSize();

 private:
  void WorkerLoop(int worker);

  const int num_workers_;
  // Serializes RunOnAll callers. std::mutex, not absl::Mutex: the system
  // Abseil is built without TSan, which then cannot see absl::Mutex ordering.
  std::mutex run_mu_;

  // Bumped (release) by RunOnAll to start a round; workers wait on it.
  std::atomic<uint32_t> generation_{0};
  // Workers (other than 0) still running the current round.
  std::atomic<uint32_t> pending_{0};
  std::atomic<bool> stop_{false};
  // The current round's function: written before generation_ is bumped, read
  // by workers after they observe the bump.
  const std::function<void(int)>* fn_ = nullptr;

  std::vector<std::thread> threads_;  // workers 1..n-1
};

}  // namespace zo

#endif  // ZO_OFFLOAD_THREAD_POOL_H_
