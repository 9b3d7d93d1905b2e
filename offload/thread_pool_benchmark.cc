// Cost of one empty round of ThreadPool::RunOnAll: the fixed per-step
// overhead of the threaded optimizer (wake every worker, wait for all).
#include <atomic>

#include "benchmark/benchmark.h"
#include "offload/thread_pool.h"

namespace zo {
namespace {

void BM_EmptyRunOnAll(benchmark::State& state) {
  ThreadPool pool(static_cast<int>(state.range(0)));
  std::atomic<int> sink{0};
  for (auto _ : state) {
    pool.RunOnAll([&](int w) { sink.fetch_add(w, std::memory_order_relaxed); });
  }
  benchmark::DoNotOptimize(sink.load());
}
BENCHMARK(BM_EmptyRunOnAll)->DenseRange(1, 4)->Arg(8)->UseRealTime();

}  // namespace
}  // namespace zo

BENCHMARK_MAIN();
