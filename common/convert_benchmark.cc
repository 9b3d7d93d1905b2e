// Throughput of the bulk conversions, per direction, SIMD level and size.
// Bytes per second count both sides (4 bytes read or written for the fp32
// element, 2 for the fp16/bf16 one).
//
//   build/.../bin/convert_benchmark --benchmark_filter='FloatToBf16'
#include <bit>
#include <cstdint>
#include <memory>
#include <random>
#include <string>

#include "benchmark/benchmark.h"
#include "common/convert.h"
#include "common/cpu_features.h"
#include "common/internal/convert_kernels.h"

namespace zo {
namespace {

constexpr int64_t kSizes[] = {int64_t{1} << 20, int64_t{1} << 26};  // 1 Mi, 64 Mi elements

// Inputs are finite values of a typical magnitude (|x| in [2^-8, 2^8)),
// written once so the pages are resident before timing starts.
struct Buffers {
  explicit Buffers(int64_t n) : f32(new float[n]), low(new uint16_t[n]) {
    std::minstd_rand rng(1);
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t r = static_cast<uint32_t>(rng());
      const uint32_t exp = 119 + (r & 15);  // 2^-8 .. 2^7
      f32[i] = std::bit_cast<float>(((r << 8) & 0x80000000u) | (exp << 23) | (r >> 8 & 0x7FFFFFu));
    }
    FloatToHalf(f32.get(), low.get(), n);
  }
  std::unique_ptr<float[]> f32;
  std::unique_ptr<uint16_t[]> low;
};

enum class Direction { kFloatToHalf, kHalfToFloat, kFloatToBf16, kBf16ToFloat };

void BM_Convert(benchmark::State& state, Direction dir, SimdLevel level, bool int_bf16) {
  if (!SimdLevelSupported(level)) {
    state.SkipWithError("SIMD level not supported on this CPU");
    return;
  }
  const int64_t n = state.range(0);
  Buffers buf(n);
  for (auto _ : state) {
    switch (dir) {
      case Direction::kFloatToHalf:
        FloatToHalf(buf.f32.get(), buf.low.get(), n, level);
        break;
      case Direction::kHalfToFloat:
        HalfToFloat(buf.low.get(), buf.f32.get(), n, level);
        break;
      case Direction::kFloatToBf16:
        if (int_bf16) {
          common_internal::FloatToBf16Avx512(buf.f32.get(), buf.low.get(), n, false);
        } else {
          FloatToBf16(buf.f32.get(), buf.low.get(), n, level);
        }
        break;
      case Direction::kBf16ToFloat:
        Bf16ToFloat(buf.low.get(), buf.f32.get(), n, level);
        break;
    }
    benchmark::DoNotOptimize(buf.low.get());
    benchmark::DoNotOptimize(buf.f32.get());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 6);
}

void RegisterAll() {
  const std::pair<const char*, Direction> dirs[] = {{"FloatToHalf", Direction::kFloatToHalf},
                                                    {"HalfToFloat", Direction::kHalfToFloat},
                                                    {"FloatToBf16", Direction::kFloatToBf16},
                                                    {"Bf16ToFloat", Direction::kBf16ToFloat}};
  for (const auto& [dir_name, dir] : dirs) {
    for (SimdLevel level : kAllSimdLevels) {
      const std::string name =
          std::string("BM_") + dir_name + "/" + std::string(SimdLevelName(level));
      auto* b = benchmark::RegisterBenchmark(name.c_str(), BM_Convert, dir, level, false);
      for (int64_t n : kSizes) b->Arg(n);
      b->Unit(benchmark::kMicrosecond);
    }
  }
  // The AVX-512 bf16 kernel without VCVTNEPS2BF16, for comparison.
  auto* b = benchmark::RegisterBenchmark("BM_FloatToBf16/avx512_intbf16", BM_Convert,
                                         Direction::kFloatToBf16, SimdLevel::kAvx512, true);
  for (int64_t n : kSizes) b->Arg(n);
  b->Unit(benchmark::kMicrosecond);
}

}  // namespace
}  // namespace zo

int main(int argc, char** argv) {
  zo::RegisterAll();
  benchmark::AddCustomContext("cpu_features", zo::CpuFeaturesString(zo::HostCpuFeatures()));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
