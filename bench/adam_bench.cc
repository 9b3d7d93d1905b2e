#include "bench/adam_bench.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "bench/internal/stream_kernels.h"
#include "common/bf16.h"
#include "common/cpu_features.h"
#include "common/fp16.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "nlohmann/json.hpp"
#include "offload/aligned_buffer.h"
#include "offload/cpu_optimizer.h"
#include "offload/optimizer_kernels.h"
#include "offload/thread_pool.h"

namespace zo::bench {
namespace {

using bench_internal::StreamCoefficients;
using bench_internal::StreamFn;

// p, m, v, grad and the copy in one mapping. Each array starts an odd number
// of cache lines past a page boundary, at a different offset for each array:
// arrays whose distances are multiples of a large power of two compete for
// the same cache sets and 4 KiB alias slots, which halves streaming
// throughput.
struct Arena {
  AlignedBuffer memory;
  float* p = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  void* grad = nullptr;
  uint16_t* copy = nullptr;
};

absl::StatusOr<Arena> MapArena(size_t n, DType grad_dtype) {
  const size_t sizes[] = {n * 4, n * 4, n * 4, n * DTypeSize(grad_dtype), n * 2};
  size_t offsets[5];
  size_t end = 0;
  for (size_t i = 0; i < 5; ++i) {
    offsets[i] = RoundUpTo(end, kPageBytes) + (2 * i + 1) * kCacheLineBytes;
    end = offsets[i] + sizes[i];
  }
  Arena arena;
  ZO_ASSIGN_OR_RETURN(arena.memory, AlignedBuffer::Allocate(end));
  char* base = arena.memory.as<char>();
  arena.p = reinterpret_cast<float*>(base + offsets[0]);
  arena.m = reinterpret_cast<float*>(base + offsets[1]);
  arena.v = reinterpret_cast<float*>(base + offsets[2]);
  arena.grad = base + offsets[3];
  arena.copy = reinterpret_cast<uint16_t*>(base + offsets[4]);
  return arena;
}

// The arena cut into server-sized chunks.
std::vector<OptimizerChunk> Chunks(const Arena& a, size_t n, size_t chunk_elems, DType grad_dtype,
                                   DType copy_dtype) {
  std::vector<OptimizerChunk> chunks;
  for (size_t begin = 0; begin < n; begin += chunk_elems) {
    OptimizerChunk c;
    c.n = std::min(chunk_elems, n - begin);
    c.p = a.p + begin;
    c.m = a.m + begin;
    c.v = a.v + begin;
    c.grad = OffsetBy(TypedConstPtr{a.grad, grad_dtype}, begin);
    c.low_precision = TypedPtr{a.copy + begin, copy_dtype};
    chunks.push_back(c);
  }
  return chunks;
}

// Deterministic values in [-1, 1) from an index (SplitMix64 finalizer).
float Noise(uint64_t i) {
  uint64_t z = i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<int64_t>(z >> 40) - (int64_t{1} << 23)) * 0x1p-23f;
}

// Master weights ~U(-1, 1), gradients ~U(-1e-2, 1e-2) stored in their dtype,
// moments zero; each worker fills its own piece after first-touching it.
void FillArena(CpuOptimizer& opt, const Arena& a) {
  opt.FirstTouchZero();
  opt.ForEachSegment([&](const OptimizerChunk& c, size_t begin, size_t end) {
    const size_t base = static_cast<size_t>(c.p - a.p);
    for (size_t i = begin; i < end; ++i) {
      c.p[i] = Noise(2 * (base + i));
      const float g = 1e-2f * Noise(2 * (base + i) + 1);
      void* grad = const_cast<void*>(c.grad.data);
      switch (c.grad.dtype) {
        case DType::kFloat32:
          static_cast<float*>(grad)[i] = g;
          break;
        case DType::kFloat16:
          static_cast<uint16_t*>(grad)[i] = FloatToHalfBits(g);
          break;
        case DType::kBFloat16:
          static_cast<uint16_t*>(grad)[i] = FloatToBf16Bits(g);
          break;
      }
    }
  });
}

StreamFn StreamFor(SimdLevel level, DType grad_dtype) {
  const bool f32 = grad_dtype == DType::kFloat32;
  switch (level) {
    case SimdLevel::kAvx512:
      return f32 ? bench_internal::StreamF32GradAvx512 : bench_internal::StreamU16GradAvx512;
    case SimdLevel::kAvx2:
      return f32 ? bench_internal::StreamF32GradAvx2 : bench_internal::StreamU16GradAvx2;
    case SimdLevel::kScalar:
      break;
  }
  return f32 ? bench_internal::StreamF32GradScalar : bench_internal::StreamU16GradScalar;
}

double Seconds(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const size_t h = x.size() / 2;
  return x.size() % 2 ? x[h] : 0.5 * (x[h - 1] + x[h]);
}

struct Result {
  SimdLevel path;
  int threads;
  double fused_s;   // median step time
  double stream_s;  // median baseline time
  double ratio;     // median over rounds of stream_s / fused_s
  double ratio_min, ratio_max;
};

Result MeasurePath(CpuOptimizer& opt, SimdLevel level, const AdamBenchOptions& o, int64_t& step) {
  const StreamFn stream = StreamFor(level, o.grad_dtype);
  const StreamCoefficients k = {1e-6f, 0.5f, 0.25f};
  AdamHyperParams hp;
  hp.weight_decay = 0.01;
  auto fused = [&] { opt.AdamStep(MakeAdamStepConstants(hp, ++step, 1.0 / 1024), level); };
  auto baseline = [&] {
    opt.ForEachSegment([&](const OptimizerChunk& c, size_t begin, size_t end) {
      stream(k, OffsetBy(c.grad, begin).data, c.p + begin, c.m + begin, c.v + begin,
             static_cast<uint16_t*>(c.low_precision.data) + begin, end - begin);
    });
  };
  fused();  // warm-up: page tables, caches, clocks
  baseline();
  std::vector<double> fused_s, stream_s, ratios;
  for (int r = 0; r < o.rounds; ++r) {
    // Alternate which goes first so neither always inherits the other's state.
    double f, s;
    if (r % 2 == 0) {
      f = Seconds(fused);
      s = Seconds(baseline);
    } else {
      s = Seconds(baseline);
      f = Seconds(fused);
    }
    fused_s.push_back(f);
    stream_s.push_back(s);
    ratios.push_back(s / f);
  }
  return {level,
          opt.workers(),
          Median(fused_s),
          Median(stream_s),
          Median(ratios),
          *std::min_element(ratios.begin(), ratios.end()),
          *std::max_element(ratios.begin(), ratios.end())};
}

void Print(const Result& r, const AdamBenchOptions& o, double bytes_per_param, std::ostream& out) {
  const double params = static_cast<double>(o.params);
  const double params_per_s = params / r.fused_s;
  const double gb_per_s = params * bytes_per_param / r.fused_s / 1e9;
  const double roofline = params * bytes_per_param / r.stream_s / 1e9;
  const bool dispatched = r.path == ActiveSimdLevel();
  if (o.json) {
    nlohmann::json j = {{"bench", "adam"},
                        {"path", std::string(SimdLevelName(r.path))},
                        {"dispatched", dispatched},
                        {"threads", r.threads},
                        {"params", o.params},
                        {"grad_dtype", std::string(DTypeName(o.grad_dtype))},
                        {"bytes_per_param", bytes_per_param},
                        {"rounds", o.rounds},
                        {"params_per_s", params_per_s},
                        {"gb_per_s", gb_per_s},
                        {"roofline_gb_per_s", roofline},
                        {"ratio", r.ratio},
                        {"ratio_min", r.ratio_min},
                        {"ratio_max", r.ratio_max}};
    out << j.dump() << std::endl;
    return;
  }
  out << absl::StrFormat("%-8s %-10s %7d %12.1f %9.2f %13.2f %7.3f   %.3f..%.3f\n",
                         std::string(SimdLevelName(r.path)), dispatched ? "yes" : "", r.threads,
                         params_per_s / 1e6, gb_per_s, roofline, r.ratio, r.ratio_min, r.ratio_max)
      << std::flush;
}

absl::Status Validate(const AdamBenchOptions& o) {
  if (o.params <= 0) return absl::InvalidArgumentError("--params must be positive");
  if (o.rounds < 1) return absl::InvalidArgumentError("--rounds must be at least 1");
  if (o.chunk_elems == 0) return absl::InvalidArgumentError("--chunk-elems must be positive");
  for (int t : o.threads) {
    if (t < 1) return absl::InvalidArgumentError(absl::StrFormat("thread count %d < 1", t));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunAdamBench(const AdamBenchOptions& options, std::ostream& out) {
  ZO_RETURN_IF_ERROR(Validate(options));
  AdamBenchOptions o = options;
  if (o.threads.empty()) {
    for (int t = 1; t <= ThreadPool::DefaultSize(); ++t) o.threads.push_back(t);
  }
  const size_t n = static_cast<size_t>(o.params);
  const DType copy_dtype = o.grad_dtype == DType::kBFloat16 ? DType::kBFloat16 : DType::kFloat16;
  // Traffic the step must move per parameter: read grad, p, m, v; write p,
  // m, v and the copy.
  const double bytes_per_param = static_cast<double>(DTypeSize(o.grad_dtype) + 12 + 12 + 2);

  if (!o.json) {
    out << absl::StrFormat(
        "adam: %d params (%s), grad %s, copy %s, %.0f B/param moved, chunks of %d, "
        "%d rounds (median)\ncpu: %s; dispatched path: %s\n"
        "ratio = fused step GB/s / STREAM-style GB/s (same bytes, threads, ISA), median of "
        "per-round ratios\n\n"
        "%-8s %-10s %7s %12s %9s %13s %7s   %s\n",
        o.params, FormatCount(static_cast<double>(o.params)), std::string(DTypeName(o.grad_dtype)),
        std::string(DTypeName(copy_dtype)), bytes_per_param, o.chunk_elems, o.rounds,
        CpuFeaturesString(HostCpuFeatures()), std::string(SimdLevelName(ActiveSimdLevel())), "path",
        "dispatched", "threads", "Mparams/s", "GB/s", "roofline GB/s", "ratio", "min..max");
  }
  int64_t step = 0;
  for (int threads : o.threads) {
    ThreadPool pool(threads);
    std::cerr << "adam: " << threads << " threads: mapping "
              << FormatBytes(bytes_per_param * static_cast<double>(n))
              << ", first touch by the owning workers\n";
    ZO_ASSIGN_OR_RETURN(Arena arena, MapArena(n, o.grad_dtype));
    CpuOptimizer opt(&pool, Chunks(arena, n, o.chunk_elems, o.grad_dtype, copy_dtype));
    FillArena(opt, arena);
    for (SimdLevel level : kAllSimdLevels) {
      if (!SimdLevelSupported(level)) continue;
      std::cerr << "adam: " << threads << " threads, " << SimdLevelName(level) << ": " << o.rounds
                << " rounds\n";
      Print(MeasurePath(opt, level, o, step), o, bytes_per_param, out);
    }
  }
  return absl::OkStatus();
}

}  // namespace zo::bench
