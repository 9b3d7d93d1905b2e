// Throughput of the fused optimizer kernels per SIMD level, gradient type,
// size and thread count, next to a STREAM-style kernel with Adam's access
// pattern (read g, p, m, v; write p, m, v and a 16-bit copy) that does no
// arithmetic worth the name: the roofline the Adam step is measured against.
// Bytes per second count the bytes the kernel must move (a 16-bit gradient:
// 2 + 12 read, 12 + 2 written = 28 per parameter); items are parameters.
//
//   build/.../bin/optimizer_kernels_benchmark --benchmark_filter='Adam/.*/n:67108864'
//
// With threads = 2 each thread owns half the parameters (allocated and first
// touched by that thread) and the iterations run in lockstep; the time is the
// wall time per iteration.
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/bf16.h"
#include "common/cpu_features.h"
#include "common/fp16.h"
#include "offload/optimizer_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace zo {
namespace {

constexpr int64_t kSizes[] = {int64_t{1} << 20, int64_t{1} << 26};  // 1 Mi, 64 Mi parameters

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// 64-byte aligned, zero-filled (so the pages are resident before timing).
template <typename T>
std::unique_ptr<T[], FreeDeleter> Allocate(int64_t n) {
  const size_t bytes = (static_cast<size_t>(n) * sizeof(T) + 63) / 64 * 64;
  T* p = static_cast<T*>(std::aligned_alloc(64, bytes));
  std::memset(p, 0, bytes);
  return std::unique_ptr<T[], FreeDeleter>(p);
}

// One thread's slice of optimizer state with realistic values.
struct Slice {
  Slice(int64_t n, DType grad_type)
      : n(n),
        grad_type(grad_type),
        grad(Allocate<float>(grad_type == DType::kFloat32 ? n : (n + 1) / 2)),
        p(Allocate<float>(n)),
        m(Allocate<float>(n)),
        v(Allocate<float>(n)),
        copy(Allocate<uint16_t>(n)) {
    std::minstd_rand rng(1);
    uint16_t* g16 = reinterpret_cast<uint16_t*>(grad.get());
    for (int64_t i = 0; i < n; ++i) {
      const float x = static_cast<float>(static_cast<int32_t>(rng() % 2001) - 1000) * 0.001f;
      p[i] = x;
      m[i] = 0.01f * x;
      v[i] = 1e-4f * x * x;
      if (grad_type == DType::kFloat32) {
        grad[i] = x * 1024;
      } else if (grad_type == DType::kFloat16) {
        g16[i] = FloatToHalfBits(x * 1024);
      } else {
        g16[i] = FloatToBf16Bits(x * 1024);
      }
    }
  }

  int64_t n;
  DType grad_type;
  std::unique_ptr<float[], FreeDeleter> grad, p, m, v;
  std::unique_ptr<uint16_t[], FreeDeleter> copy;
};

bool CheckLevel(benchmark::State& state, SimdLevel level) {
  if (SimdLevelSupported(level)) return true;
  state.SkipWithError("SIMD level not supported on this CPU");
  return false;
}

// Runs body(slice) once per benchmark iteration on range(1) threads in
// lockstep (the caller is member 0), each on its own slice of range(0) / threads
// parameters that it allocated and first touched, and reports each
// iteration's wall time: what the step engine's workers do.
void RunTeam(benchmark::State& state, DType grad_type, int64_t bytes_per_param,
             const std::function<void(Slice&)>& body) {
  const int threads = static_cast<int>(state.range(1));
  const int64_t n = state.range(0);
  std::vector<std::unique_ptr<Slice>> slices(threads);
  std::barrier sync(threads);
  std::atomic<bool> done{false};
  auto member = [&](int me) {
    slices[me] = std::make_unique<Slice>(n / threads, grad_type);
    sync.arrive_and_wait();
    while (true) {
      sync.arrive_and_wait();  // start of an iteration, or the end
      if (done.load()) return;
      body(*slices[me]);
      sync.arrive_and_wait();
    }
  };
  std::vector<std::thread> workers;
  for (int i = 1; i < threads; ++i) workers.emplace_back(member, i);
  slices[0] = std::make_unique<Slice>(n / threads, grad_type);
  sync.arrive_and_wait();
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    sync.arrive_and_wait();
    body(*slices[0]);
    sync.arrive_and_wait();
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  done.store(true);
  sync.arrive_and_wait();
  for (std::thread& t : workers) t.join();
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * bytes_per_param);
}

int64_t AdamBytesPerParam(DType grad_type) {
  return static_cast<int64_t>(DTypeSize(grad_type)) + 12 + 12 + 2;
}

void BM_Adam(benchmark::State& state, SimdLevel level, DType grad_type) {
  if (!CheckLevel(state, level)) return;
  AdamHyperParams hp;
  hp.weight_decay = 0.01;
  const AdamStepConstants c = MakeAdamStepConstants(hp, 10, 1.0 / 1024);
  const DType copy_type = grad_type == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
  RunTeam(state, grad_type, AdamBytesPerParam(grad_type), [&](Slice& s) {
    AdamUpdate(c, {s.grad.get(), grad_type}, s.p.get(), s.m.get(), s.v.get(),
               {s.copy.get(), copy_type}, s.n, level);
  });
}

void BM_Accumulate(benchmark::State& state, SimdLevel level, bool with_stats) {
  if (!CheckLevel(state, level)) return;
  RunTeam(state, DType::kFloat16, 2 + 4 + 4, [&](Slice& s) {
    GradStats stats;
    AccumulateGradient({s.grad.get(), DType::kFloat16}, s.p.get(), s.n, false,
                       with_stats ? &stats : nullptr, level);
    benchmark::DoNotOptimize(stats);
  });
}

void BM_Stats(benchmark::State& state, SimdLevel level) {
  if (!CheckLevel(state, level)) return;
  RunTeam(state, DType::kFloat32, 4, [&](Slice& s) {
    benchmark::DoNotOptimize(ComputeGradStats({s.grad.get(), DType::kFloat32}, s.n, level));
  });
}

#if defined(__x86_64__)
// The roofline: Adam's loads and stores, 16-bit gradient and copy, with one
// add per stream so nothing is optimised away.
__attribute__((target("avx512f"))) void StreamAdamPattern(const uint16_t* g, float* p, float* m,
                                                          float* v, uint16_t* copy, int64_t n) {
  for (int64_t i = 0; i + 16 <= n; i += 16) {
    const __m256i gi = _mm256_load_si256(reinterpret_cast<const __m256i*>(g + i));
    const __m512 pp = _mm512_load_ps(p + i), mm = _mm512_load_ps(m + i);
    const __m512 vv = _mm512_load_ps(v + i);
    _mm512_store_ps(p + i, _mm512_add_ps(pp, mm));
    _mm512_store_ps(m + i, _mm512_add_ps(mm, vv));
    _mm512_store_ps(v + i, _mm512_add_ps(vv, pp));
    _mm256_store_si256(reinterpret_cast<__m256i*>(copy + i), gi);
  }
}

void BM_StreamAdamPattern(benchmark::State& state) {
  if (!CheckLevel(state, SimdLevel::kAvx512)) return;
  RunTeam(state, DType::kFloat16, AdamBytesPerParam(DType::kFloat16), [](Slice& s) {
    StreamAdamPattern(reinterpret_cast<const uint16_t*>(s.grad.get()), s.p.get(), s.m.get(),
                      s.v.get(), s.copy.get(), s.n);
  });
}
#endif

// Sizes are multiples of 2 threads * 64 parameters.
void Configure(benchmark::internal::Benchmark* b) {
  for (int64_t n : kSizes) {
    for (int64_t threads : {1, 2}) b->Args({n, threads});
  }
  b->ArgNames({"n", "threads"})->UseManualTime()->Unit(benchmark::kMillisecond);
}

void RegisterAll() {
  const std::pair<DType, const char*> grads[] = {
      {DType::kFloat16, "fp16"}, {DType::kBFloat16, "bf16"}, {DType::kFloat32, "fp32"}};
  for (SimdLevel level : kAllSimdLevels) {
    const std::string lv(SimdLevelName(level));
    for (const auto& [type, name] : grads) {
      Configure(
          benchmark::RegisterBenchmark(("Adam/" + lv + "/" + name).c_str(), BM_Adam, level, type));
    }
    Configure(benchmark::RegisterBenchmark(("AccumulateFp16/" + lv).c_str(), BM_Accumulate, level,
                                           false));
    Configure(benchmark::RegisterBenchmark(("AccumulateFp16WithStats/" + lv).c_str(), BM_Accumulate,
                                           level, true));
    Configure(benchmark::RegisterBenchmark(("StatsFp32/" + lv).c_str(), BM_Stats, level));
  }
#if defined(__x86_64__)
  Configure(benchmark::RegisterBenchmark("StreamAdamPattern/fp16", BM_StreamAdamPattern));
#endif
}

}  // namespace
}  // namespace zo

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  zo::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
