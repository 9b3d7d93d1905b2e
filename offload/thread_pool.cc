#include "offload/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "common/cpu_features.h"

namespace zo {
namespace {

// Polls briefly (a few microseconds) before the futex sleep: a round's
// workers finish close together, so the caller often sees completion without
// sleeping. Kept short because longer spins cost far more than they save when
// the cores are oversubscribed (measured with thread_pool_benchmark: 64
// polls ~1 us per empty round on 2 workers, 4000 polls 150 us on 3 workers
// sharing 2 cores).
constexpr int kSpinIterations = 64;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Returns once `word` no longer holds `old`, with acquire ordering.
uint32_t WaitWhileEquals(const std::atomic<uint32_t>& word, uint32_t old) {
  for (int i = 0; i < kSpinIterations; ++i) {
    const uint32_t now = word.load(std::memory_order_acquire);
    if (now != old) return now;
    CpuRelax();
  }
  for (;;) {
    word.wait(old, std::memory_order_acquire);
    const uint32_t now = word.load(std::memory_order_acquire);
    if (now != old) return now;
  }
}

}  // namespace

int ThreadPool::DefaultSize() { return HostThreads(); }

ThreadPool::ThreadPool(int num_workers)
    : num_workers_(num_workers > 0 ? num_workers : DefaultSize()) {
  threads_.reserve(num_workers_ - 1);
  for (int w = 1; w < num_workers_; ++w) threads_.emplace_back([this, w] { WorkerLoop(w); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ThreadPool::RunOnAll(const std::function<void(int worker)>& fn) {
  std::lock_guard<std::mutex> lock(run_mu_);
  if (num_workers_ == 1) {
    fn(0);
    return;
  }
  fn_ = &fn;
  pending_.store(static_cast<uint32_t>(num_workers_ - 1), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  fn(0);
  for (uint32_t left = pending_.load(std::memory_order_acquire); left != 0;) {
    left = WaitWhileEquals(pending_, left);
  }
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop(int worker) {
  // generation_ was 0 when the pool was built; loading it here instead could
  // miss a round started before this thread got going.
  uint32_t seen = 0;
  for (;;) {
    seen = WaitWhileEquals(generation_, seen);
    if (stop_.load(std::memory_order_relaxed)) return;
    (*fn_)(worker);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

}  // namespace zo
