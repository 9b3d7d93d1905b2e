// Time per call of each CPU backend op at zo-train's demo shapes (GPT-lite:
// micro-batch 16 x context 64 = 1024 rows, width 128, 4 heads), so a
// profile of a training step can be read op by op.
//
//   build/.../bin/cpu_backend_benchmark --blas_threads=1
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace zo::backend {
namespace {

constexpr int kBatch = 16, kT = 64, kC = 128, kHeads = 4, kVocab = 65;
constexpr int64_t kRows = int64_t{kBatch} * kT;

int blas_threads = 0;

Backend& Be() {
  static Backend* be = MakeCpuBackend({.blas_threads = blas_threads}).release();
  return *be;
}

Tensor Random(Shape shape, DType dtype = DType::kFloat16) {
  Tensor t = Be().Empty(dtype, shape);
  std::vector<float> v(t.numel());
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : v) x = dist(rng);
  (void)Be().UploadFloat(v, t);
  return t;
}

void BM_Linear(benchmark::State& state) {
  const int64_t in = state.range(0), out = state.range(1);
  const Tensor x = Random({kRows, in}), w = Random({out, in}), b = Random({out});
  for (auto _ : state) benchmark::DoNotOptimize(Be().Linear(x, w, b));
  state.SetItemsProcessed(state.iterations() * 2 * kRows * in * out);  // flops
}
BENCHMARK(BM_Linear)->Args({kC, 3 * kC})->Args({kC, kC})->Args({kC, 4 * kC})->Args({4 * kC, kC});

void BM_LinearBackward(benchmark::State& state) {
  const int64_t in = state.range(0), out = state.range(1);
  const Tensor x = Random({kRows, in}), w = Random({out, in}), dy = Random({kRows, out});
  Tensor dw = Random({out, in}, DType::kFloat32), db = Random({out}, DType::kFloat32);
  for (auto _ : state) benchmark::DoNotOptimize(Be().LinearBackward(x, w, dy, true, dw, &db));
  state.SetItemsProcessed(state.iterations() * 4 * kRows * in * out);
}
BENCHMARK(BM_LinearBackward)
    ->Args({kC, 3 * kC})
    ->Args({kC, kC})
    ->Args({kC, 4 * kC})
    ->Args({4 * kC, kC});

void BM_Attention(benchmark::State& state) {
  const Tensor qkv = Random({kRows, 3 * kC});
  Tensor lse = Be().Empty(DType::kFloat32, {kBatch, kHeads, kT});
  for (auto _ : state) benchmark::DoNotOptimize(Be().Attention(qkv, kBatch, kHeads, lse));
}
BENCHMARK(BM_Attention);

void BM_AttentionBackward(benchmark::State& state) {
  const Tensor qkv = Random({kRows, 3 * kC}), dy = Random({kRows, kC});
  Tensor lse = Be().Empty(DType::kFloat32, {kBatch, kHeads, kT});
  const Tensor y = Be().Attention(qkv, kBatch, kHeads, lse);
  for (auto _ : state) {
    benchmark::DoNotOptimize(Be().AttentionBackward(qkv, y, lse, dy, kBatch, kHeads));
  }
}
BENCHMARK(BM_AttentionBackward);

void BM_LayerNorm(benchmark::State& state) {
  const Tensor x = Random({kRows, kC}), g = Random({kC}), b = Random({kC});
  Tensor mean = Be().Empty(DType::kFloat32, {kRows}), rstd = Be().Empty(DType::kFloat32, {kRows});
  for (auto _ : state) benchmark::DoNotOptimize(Be().LayerNorm(x, g, b, 1e-5f, mean, rstd));
}
BENCHMARK(BM_LayerNorm);

void BM_LayerNormBackward(benchmark::State& state) {
  const Tensor x = Random({kRows, kC}), g = Random({kC}), b = Random({kC}),
               dy = Random({kRows, kC});
  Tensor mean = Be().Empty(DType::kFloat32, {kRows}), rstd = Be().Empty(DType::kFloat32, {kRows});
  (void)Be().LayerNorm(x, g, b, 1e-5f, mean, rstd);
  Tensor dg = Random({kC}, DType::kFloat32), db = Random({kC}, DType::kFloat32);
  for (auto _ : state) {
    benchmark::DoNotOptimize(Be().LayerNormBackward(x, g, mean, rstd, dy, dg, db));
  }
}
BENCHMARK(BM_LayerNormBackward);

void BM_Gelu(benchmark::State& state) {
  const Tensor x = Random({kRows, 4 * kC});
  for (auto _ : state) benchmark::DoNotOptimize(Be().Gelu(x));
  state.SetItemsProcessed(state.iterations() * kRows * 4 * kC);
}
BENCHMARK(BM_Gelu);

void BM_GeluBackward(benchmark::State& state) {
  const Tensor x = Random({kRows, 4 * kC}), dy = Random({kRows, 4 * kC});
  for (auto _ : state) benchmark::DoNotOptimize(Be().GeluBackward(x, dy));
  state.SetItemsProcessed(state.iterations() * kRows * 4 * kC);
}
BENCHMARK(BM_GeluBackward);

void BM_Add(benchmark::State& state) {
  const Tensor a = Random({kRows, kC}), b = Random({kRows, kC});
  for (auto _ : state) benchmark::DoNotOptimize(Be().Add(a, b));
}
BENCHMARK(BM_Add);

void BM_CrossEntropyBackward(benchmark::State& state) {
  const Tensor logits = Random({kRows, kVocab});
  std::vector<int32_t> targets(kRows);
  for (int64_t r = 0; r < kRows; ++r) targets[r] = static_cast<int32_t>(r % kVocab);
  for (auto _ : state) {
    benchmark::DoNotOptimize(Be().CrossEntropy(logits, targets));
    benchmark::DoNotOptimize(Be().CrossEntropyBackward(logits, targets, 1.0f));
  }
}
BENCHMARK(BM_CrossEntropyBackward);

}  // namespace
}  // namespace zo::backend

int main(int argc, char** argv) {
  // --blas_threads=N before google benchmark sees the flags.
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--blas_threads=", 15) == 0) {
      zo::backend::blas_threads = std::atoi(argv[i] + 15);
      for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
      --argc;
      break;
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
