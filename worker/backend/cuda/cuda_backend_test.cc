// Every op of the CUDA backend against the CPU backend, the reference: the
// same inputs (random values rounded to the storage dtype), forward and
// backward, in fp32, fp16 and bf16 storage.
//
// Tolerances. Both backends compute in fp32 and round each output once to
// its dtype; they differ only in the order of fp32 sums (tensor-core GEMM
// tiles, block reductions). That order moves a sum by a few fp32 ulps, which
// can flip one rounding of the output: 1 ulp of the storage dtype, 2^-10
// relative for fp16, 2^-7 for bf16. Outputs are allowed 2 such ulps of the
// larger of |reference| and a floor (a fraction of the output's largest
// value: where terms cancel, the absolute error follows the terms, not the
// small result). Attention gets 8: the fused kernels round the
// probabilities (and dS) to the storage dtype before multiplying them on
// tensor cores, as flash attention does, where the CPU keeps them fp32; and
// its backward reads the rounded y. fp32 outputs (fp32 storage, and every
// fp32 gradient accumulator) are held to 2e-5 of the tensor's largest value:
// an fp32 sum's error follows the size of its partial sums, eps x sqrt(n)
// x |partial sum| ~ 6e-8 x 40 x (the largest output) for the test's sums of
// ~1000 terms; the CPU's sequential sums carry most of it.
#include "worker/backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace zo::backend {
namespace {

// Relative size of one rounding in `dtype`.
double Ulp(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return 1.0 / 1024;
    case DType::kBFloat16:
      return 1.0 / 128;
    case DType::kFloat32:
      return 1e-5;
  }
  return 0;
}

class CudaBackendTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    std::string why;
    if (CudaDeviceCount(&why) == 0) {
      GTEST_SKIP() << "no CUDA device (" << why << "); these run on a GPU machine: ctest -L gpu";
    }
    auto gpu = MakeCudaBackend({.device = 0, .deterministic = true});
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(*gpu);
    cpu_ = MakeCpuBackend({.blas_threads = 1});
  }

  DType dtype() const { return GetParam(); }

  std::vector<float> Random(int64_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = dist(rng_);
    return v;
  }

  // The same values on both backends (rounded to `dt` on the way in, by the
  // same round-to-nearest-even on both).
  struct Pair {
    Tensor cpu, gpu;
  };
  Pair Make(const std::vector<float>& values, const Shape& shape, DType dt) {
    Pair p{cpu_->Empty(dt, shape), gpu_->Empty(dt, shape)};
    EXPECT_TRUE(cpu_->UploadFloat(values, p.cpu).ok());
    EXPECT_TRUE(gpu_->UploadFloat(values, p.gpu).ok());
    return p;
  }
  Pair MakeRandom(const Shape& shape, DType dt, float lo = -1.0f, float hi = 1.0f) {
    const std::vector<float> values = Random(NumElements(shape), lo, hi);
    return Make(values, shape, dt);
  }

  std::vector<float> Host(Backend& b, const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    EXPECT_TRUE(b.DownloadFloat(t, absl::MakeSpan(v)).ok());
    return v;
  }

  // Checks gpu against cpu (shapes, dtypes and values) within `ulps` of the
  // output dtype, relative to max(|cpu value|, floor * max |cpu|).
  void Expect(const std::string& what, const Tensor& gpu, const Tensor& cpu, double ulps = 2,
              double floor = 1.0 / 64) {
    ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
    ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
    const std::vector<float> g = Host(*gpu_, gpu), c = Host(*cpu_, cpu);
    if (cpu.dtype() == DType::kFloat32) floor = 1;  // relative to the largest value, see above
    double max_abs = 0;
    for (float v : c) max_abs = std::max(max_abs, std::fabs(double{v}));
    const double ulp = Ulp(cpu.dtype());
    int bad = 0;
    double worst = 0;
    size_t worst_i = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      const double allowed = ulps * ulp * std::max(std::fabs(double{c[i]}), floor * max_abs);
      const double err = std::fabs(double{g[i]} - double{c[i]});
      if (!(err <= allowed)) {  // also catches NaN
        ++bad;
        if (!(err <= worst)) {
          worst = err;
          worst_i = i;
        }
      }
    }
    EXPECT_EQ(bad, 0) << what << " (" << DTypeName(cpu.dtype()) << "): " << bad << " of "
                      << c.size() << " off; worst at " << worst_i << ": gpu " << g[worst_i]
                      << " cpu " << c[worst_i] << " (max |cpu| " << max_abs << ")";
  }

  std::mt19937 rng_{7};
  std::unique_ptr<Backend> gpu_, cpu_;
};

TEST_P(CudaBackendTest, UploadDownloadAndCastRoundTrip) {
  const std::vector<float> v = Random(1000, -8, 8);
  Pair p = Make(v, {10, 100}, dtype());
  Expect("upload", p.gpu, p.cpu, 0);
  std::vector<std::byte> bytes(static_cast<size_t>(p.gpu.nbytes()));
  ASSERT_TRUE(gpu_->Download(p.gpu, absl::MakeSpan(bytes)).ok());
  Tensor back = gpu_->Empty(dtype(), {10, 100});
  ASSERT_TRUE(gpu_->Upload(bytes, back).ok());
  Expect("bytes round trip", back, p.cpu, 0);
  for (DType to : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    Expect(std::string("cast to ") + std::string(DTypeName(to)), gpu_->Cast(p.gpu, to),
           cpu_->Cast(p.cpu, to), 0);
  }
  // Wrong sizes are refused, and the tensor keeps its contents.
  EXPECT_EQ(gpu_->Upload(absl::MakeSpan(bytes).subspan(2), back).code(),
            absl::StatusCode::kInvalidArgument);
  Expect("after a refused upload", back, p.cpu, 0);
}

TEST_P(CudaBackendTest, DownloadAsyncDeliversTheBytesWhileComputeGoesOn) {
  Pair x = MakeRandom({300, 77}, dtype(), -3, 3);
  const size_t bytes = static_cast<size_t>(x.gpu.nbytes());
  std::shared_ptr<std::byte> host = gpu_->AllocateHost(bytes);
  std::promise<absl::Status> done;
  // The source is a temporary the caller drops at once; compute queued
  // after the call goes on.
  gpu_->DownloadAsync(gpu_->Cast(x.gpu, dtype()), absl::MakeSpan(host.get(), bytes),
                      [&](absl::Status s) { done.set_value(s); });
  const Tensor later = gpu_->Gelu(gpu_->Gelu(x.gpu));
  ASSERT_TRUE(done.get_future().get().ok());
  std::vector<std::byte> want(bytes);
  ASSERT_TRUE(gpu_->Download(x.gpu, absl::MakeSpan(want)).ok());
  EXPECT_EQ(std::memcmp(host.get(), want.data(), bytes), 0);
  Expect("compute queued after the copy", later, cpu_->Gelu(cpu_->Gelu(x.cpu)));

  std::promise<absl::Status> refused;
  gpu_->DownloadAsync(x.gpu, absl::MakeSpan(host.get(), bytes - 2),
                      [&](absl::Status s) { refused.set_value(s); });
  EXPECT_EQ(refused.get_future().get().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(CudaBackendTest, UploadAsyncWaitsForWorkThatStillReadsItsTarget) {
  Pair x = MakeRandom({300, 77}, dtype(), -3, 3), y = MakeRandom({300, 77}, dtype(), -3, 3);
  const size_t bytes = static_cast<size_t>(x.gpu.nbytes());
  std::vector<std::byte> x_bytes(bytes), y_bytes(bytes);
  ASSERT_TRUE(gpu_->Download(x.gpu, absl::MakeSpan(x_bytes)).ok());
  ASSERT_TRUE(gpu_->Download(y.gpu, absl::MakeSpan(y_bytes)).ok());
  std::shared_ptr<std::byte> host = gpu_->AllocateHost(bytes);
  std::memcpy(host.get(), y_bytes.data(), bytes);
  Tensor target = gpu_->Empty(dtype(), {300, 77});
  ASSERT_TRUE(gpu_->Upload(x_bytes, target).ok());
  // Queued before the upload: must still read x.
  const Tensor before = gpu_->Gelu(gpu_->Gelu(target));
  std::promise<absl::Status> done;
  gpu_->UploadAsync(absl::MakeConstSpan(host.get(), bytes), target,
                    [&](absl::Status s) { done.set_value(s); });
  ASSERT_TRUE(done.get_future().get().ok());
  Expect("compute queued before the copy", before, cpu_->Gelu(cpu_->Gelu(x.cpu)));
  std::vector<std::byte> got(bytes);
  ASSERT_TRUE(gpu_->Download(target, absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, y_bytes);

  std::promise<absl::Status> refused;
  gpu_->UploadAsync(absl::MakeConstSpan(host.get(), bytes - 2), target,
                    [&](absl::Status s) { refused.set_value(s); });
  EXPECT_EQ(refused.get_future().get().code(), absl::StatusCode::kInvalidArgument);
}

// The prefetch's uploads (OffloadLink): after the work queued before the
// mark, which still reads the target, whatever is queued between.
TEST_P(CudaBackendTest, UploadAsyncAfterWaitsForTheWorkBeforeItsMark) {
  Pair x = MakeRandom({300, 77}, dtype(), -3, 3), y = MakeRandom({300, 77}, dtype(), -3, 3);
  const size_t bytes = static_cast<size_t>(x.gpu.nbytes());
  std::vector<std::byte> x_bytes(bytes), y_bytes(bytes);
  ASSERT_TRUE(gpu_->Download(x.gpu, absl::MakeSpan(x_bytes)).ok());
  ASSERT_TRUE(gpu_->Download(y.gpu, absl::MakeSpan(y_bytes)).ok());
  std::shared_ptr<std::byte> host = gpu_->AllocateHost(bytes);
  std::memcpy(host.get(), y_bytes.data(), bytes);
  Tensor target = gpu_->Empty(dtype(), {300, 77});
  ASSERT_TRUE(gpu_->Upload(x_bytes, target).ok());
  const Tensor before = gpu_->Gelu(gpu_->Gelu(target));  // reads x
  const std::shared_ptr<const void> mark = gpu_->QueuedWorkMark();
  ASSERT_NE(mark, nullptr);
  const Tensor between = gpu_->Gelu(x.gpu);  // reads no target
  std::promise<absl::Status> done;
  gpu_->UploadAsyncAfter(absl::MakeConstSpan(host.get(), bytes), target, mark,
                         [&](absl::Status s) { done.set_value(s); });
  ASSERT_TRUE(done.get_future().get().ok());
  Expect("compute queued before the mark", before, cpu_->Gelu(cpu_->Gelu(x.cpu)));
  Expect("compute queued after the mark", between, cpu_->Gelu(x.cpu));
  std::vector<std::byte> got(bytes);
  ASSERT_TRUE(gpu_->Download(target, absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, y_bytes);
}

TEST_P(CudaBackendTest, CastOverflowsToInf) {
  Pair p = Make({1e6f, -1e6f, 65504.0f, 1.0f}, {4}, DType::kFloat32);
  const std::vector<float> h = Host(*gpu_, gpu_->Cast(p.gpu, DType::kFloat16));
  EXPECT_EQ(h[0], std::numeric_limits<float>::infinity());
  EXPECT_EQ(h[1], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(h[2], 65504.0f);
  EXPECT_EQ(h[3], 1.0f);
}

TEST_P(CudaBackendTest, Linear) {
  for (auto [rows, in, out] : {std::tuple{7, 5, 3}, {64, 96, 80}, {256, 768, 1000}}) {
    const std::string at = "rows " + std::to_string(rows) + " in " + std::to_string(in) + " out " +
                           std::to_string(out) + ": ";
    Pair x = MakeRandom({rows, in}, dtype()), w = MakeRandom({out, in}, dtype(), -0.2f, 0.2f);
    Pair b = MakeRandom({out}, dtype());
    Expect(at + "y", gpu_->Linear(x.gpu, w.gpu, b.gpu), cpu_->Linear(x.cpu, w.cpu, b.cpu));
    Expect(at + "y without bias", gpu_->Linear(x.gpu, w.gpu, Tensor()),
           cpu_->Linear(x.cpu, w.cpu, Tensor()));
    Pair dy = MakeRandom({rows, out}, dtype());
    // Gradients accumulate into what is there.
    Pair dw = MakeRandom({out, in}, DType::kFloat32), db = MakeRandom({out}, DType::kFloat32);
    const Tensor dx_gpu = gpu_->LinearBackward(x.gpu, w.gpu, dy.gpu, true, dw.gpu, &db.gpu);
    const Tensor dx_cpu = cpu_->LinearBackward(x.cpu, w.cpu, dy.cpu, true, dw.cpu, &db.cpu);
    Expect(at + "dx", dx_gpu, dx_cpu);
    Expect(at + "dw", dw.gpu, dw.cpu);
    Expect(at + "db", db.gpu, db.cpu);
    EXPECT_FALSE(gpu_->LinearBackward(x.gpu, w.gpu, dy.gpu, false, dw.gpu, nullptr).defined());
  }
}

TEST_P(CudaBackendTest, Embedding) {
  constexpr int kVocab = 13, kBlock = 6, kC = 40;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 3 * kBlock; ++i) tokens.push_back((i * 5 + i / 4) % kVocab);  // repeats
  Pair wte = MakeRandom({kVocab, kC}, dtype()), wpe = MakeRandom({kBlock, kC}, dtype());
  Expect("y", gpu_->Embedding(tokens, kBlock, wte.gpu, wpe.gpu),
         cpu_->Embedding(tokens, kBlock, wte.cpu, wpe.cpu));
  Pair dy = MakeRandom({3 * kBlock, kC}, dtype());
  Pair dwte = MakeRandom({kVocab, kC}, DType::kFloat32);
  Pair dwpe = MakeRandom({kBlock, kC}, DType::kFloat32);
  gpu_->EmbeddingBackward(tokens, kBlock, dy.gpu, dwte.gpu, dwpe.gpu);
  cpu_->EmbeddingBackward(tokens, kBlock, dy.cpu, dwte.cpu, dwpe.cpu);
  Expect("dwte", dwte.gpu, dwte.cpu);
  Expect("dwpe", dwpe.gpu, dwpe.cpu);
}

TEST_P(CudaBackendTest, LayerNorm) {
  for (auto [rows, c] : {std::pair{5, 7}, {64, 768}, {33, 1600}, {17, 3072}}) {
    const std::string at = "rows " + std::to_string(rows) + " c " + std::to_string(c) + ": ";
    // An offset mean: the two-pass variance must not cancel.
    Pair x = MakeRandom({rows, c}, dtype(), 2.0f, 4.0f);
    Pair gamma = MakeRandom({c}, dtype(), 0.5f, 1.5f), beta = MakeRandom({c}, dtype());
    Pair mean{cpu_->Empty(DType::kFloat32, {rows}), gpu_->Empty(DType::kFloat32, {rows})};
    Pair rstd{cpu_->Empty(DType::kFloat32, {rows}), gpu_->Empty(DType::kFloat32, {rows})};
    Expect(at + "y", gpu_->LayerNorm(x.gpu, gamma.gpu, beta.gpu, 1e-5f, mean.gpu, rstd.gpu),
           cpu_->LayerNorm(x.cpu, gamma.cpu, beta.cpu, 1e-5f, mean.cpu, rstd.cpu));
    Expect(at + "mean", mean.gpu, mean.cpu);
    Expect(at + "rstd", rstd.gpu, rstd.cpu);
    Pair dy = MakeRandom({rows, c}, dtype());
    Pair dg = MakeRandom({c}, DType::kFloat32), dbeta = MakeRandom({c}, DType::kFloat32);
    const Tensor dx_gpu =
        gpu_->LayerNormBackward(x.gpu, gamma.gpu, mean.gpu, rstd.gpu, dy.gpu, dg.gpu, dbeta.gpu);
    const Tensor dx_cpu =
        cpu_->LayerNormBackward(x.cpu, gamma.cpu, mean.cpu, rstd.cpu, dy.cpu, dg.cpu, dbeta.cpu);
    // dx subtracts two row means from dxhat: cancellation, hence the floor.
    Expect(at + "dx", dx_gpu, dx_cpu, 2, 1.0 / 16);
    Expect(at + "dgamma", dg.gpu, dg.cpu);
    Expect(at + "dbeta", dbeta.gpu, dbeta.cpu);
  }
}

TEST_P(CudaBackendTest, Pointwise) {
  const Shape shape{37, 129};
  Pair x = MakeRandom(shape, dtype(), -5, 5), dy = MakeRandom(shape, dtype());
  Pair b = MakeRandom(shape, dtype());
  Expect("gelu", gpu_->Gelu(x.gpu), cpu_->Gelu(x.cpu));
  Expect("gelu backward", gpu_->GeluBackward(x.gpu, dy.gpu), cpu_->GeluBackward(x.cpu, dy.cpu));
  Expect("relu", gpu_->Relu(x.gpu), cpu_->Relu(x.cpu), 0);
  Expect("relu backward", gpu_->ReluBackward(x.gpu, dy.gpu), cpu_->ReluBackward(x.cpu, dy.cpu), 0);
  Expect("add", gpu_->Add(x.gpu, b.gpu), cpu_->Add(x.cpu, b.cpu), 0);
  gpu_->AddInto(x.gpu, b.gpu);
  cpu_->AddInto(x.cpu, b.cpu);
  Expect("add into", b.gpu, b.cpu, 0);
  // The same fmas in the same order: the same bits, with and without terms.
  Pair grad = MakeRandom(x.cpu.shape(), DType::kFloat32, -3, 3);
  Pair out{cpu_->Empty(dtype(), x.cpu.shape()), gpu_->Empty(dtype(), x.cpu.shape())};
  gpu_->CombineWeights(x.gpu, b.gpu, grad.gpu, 1.9f, -0.88f, 0.013f, out.gpu);
  cpu_->CombineWeights(x.cpu, b.cpu, grad.cpu, 1.9f, -0.88f, 0.013f, out.cpu);
  Expect("combine weights", out.gpu, out.cpu, 0);
  gpu_->CombineWeights(x.gpu, Tensor(), Tensor(), 1, 0, 0, out.gpu);
  Expect("combine weights: a copy", out.gpu, x.cpu, 0);
}

TEST_P(CudaBackendTest, Attention) {
  struct Case {
    int batch, t, heads, d;
  };
  // Tails that are not a multiple of any tile; the benchmark's head width
  // (64, the tensor-core path); 128, the largest bucket (gpu_largest's
  // 3072 / 24), and 96 inside it.
  for (const Case& k : {Case{2, 5, 2, 4}, Case{2, 37, 3, 16}, Case{1, 130, 2, 64},
                        Case{2, 256, 4, 64}, Case{1, 70, 2, 96}, Case{2, 200, 3, 128}}) {
    const int c = k.heads * k.d;
    const std::string at = "batch " + std::to_string(k.batch) + " t " + std::to_string(k.t) +
                           " heads " + std::to_string(k.heads) + " d " + std::to_string(k.d) + ": ";
    Pair qkv = MakeRandom({k.batch * k.t, 3 * c}, dtype(), -2, 2);
    Pair lse{cpu_->Empty(DType::kFloat32, {k.batch, k.heads, k.t}),
             gpu_->Empty(DType::kFloat32, {k.batch, k.heads, k.t})};
    const Tensor y_gpu = gpu_->Attention(qkv.gpu, k.batch, k.heads, lse.gpu);
    const Tensor y_cpu = cpu_->Attention(qkv.cpu, k.batch, k.heads, lse.cpu);
    Expect(at + "y", y_gpu, y_cpu, 8, 1.0 / 16);
    Expect(at + "lse", lse.gpu, lse.cpu, 2, 1.0 / 16);
    Pair dy = MakeRandom({k.batch * k.t, c}, dtype());
    Expect(at + "dqkv", gpu_->AttentionBackward(qkv.gpu, y_gpu, lse.gpu, dy.gpu, k.batch, k.heads),
           cpu_->AttentionBackward(qkv.cpu, y_cpu, lse.cpu, dy.cpu, k.batch, k.heads), 8, 1.0 / 16);
  }
}

TEST_P(CudaBackendTest, CrossEntropy) {
  for (int vocab : {10, 1000, 50304}) {
    const int rows = 24;
    std::vector<int32_t> targets;
    for (int r = 0; r < rows; ++r) targets.push_back((r * 7919) % vocab);
    Pair logits = MakeRandom({rows, vocab}, dtype(), -6, 6);
    const std::string at = "vocab " + std::to_string(vocab) + ": ";
    Expect(at + "loss", gpu_->CrossEntropy(logits.gpu, targets),
           cpu_->CrossEntropy(logits.cpu, targets));
    Expect(at + "dlogits", gpu_->CrossEntropyBackward(logits.gpu, targets, 1024.0f),
           cpu_->CrossEntropyBackward(logits.cpu, targets, 1024.0f));
  }
}

// --deterministic: the same inputs give the same bits, run after run.
TEST_P(CudaBackendTest, SameInputsSameBits) {
  Pair x = MakeRandom({512, 256}, dtype()), w = MakeRandom({384, 256}, dtype());
  Pair qkv = MakeRandom({2 * 128, 3 * 128}, dtype(), -2, 2);
  Pair dy = MakeRandom({512, 384}, dtype()), dya = MakeRandom({2 * 128, 128}, dtype());
  std::vector<int32_t> tokens(512);
  for (int i = 0; i < 512; ++i) tokens[i] = (i * 31) % 50;
  const auto run = [&] {
    Tensor dw = gpu_->Zeros(DType::kFloat32, {384, 256}), db = gpu_->Zeros(DType::kFloat32, {384});
    Tensor dx = gpu_->LinearBackward(x.gpu, w.gpu, dy.gpu, true, dw, &db);
    Tensor lse = gpu_->Empty(DType::kFloat32, {2, 2, 128});
    Tensor y = gpu_->Attention(qkv.gpu, 2, 2, lse);
    Tensor dqkv = gpu_->AttentionBackward(qkv.gpu, y, lse, dya.gpu, 2, 2);
    Tensor dwte = gpu_->Zeros(DType::kFloat32, {50, 256});
    Tensor dwpe = gpu_->Zeros(DType::kFloat32, {128, 256});
    gpu_->EmbeddingBackward(tokens, 128, x.gpu, dwte, dwpe);
    std::vector<std::vector<float>> out;
    for (const Tensor* t : {&dx, &dw, &db, &y, &lse, &dqkv, &dwte, &dwpe}) {
      out.push_back(Host(*gpu_, *t));
    }
    return out;
  };
  const auto first = run();
  const auto second = run();
  ASSERT_EQ(first.size(), second.size());
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(std::memcmp(first[i].data(), second[i].data(), first[i].size() * sizeof(float)), 0)
        << "output " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Storage, CudaBackendTest,
                         ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                         ::testing::PrintToStringParamName());

// Out of device memory is a Status naming the shape, the bytes asked and
// the bytes free, not an abort; after it the backend's ops do nothing (no
// launch on the placeholders) and transfers return the same status, while a
// new backend on the device works.
TEST(CudaBackendFailureTest, OutOfMemoryIsAStatusAndLaterOpsDoNothing) {
  std::string why;
  if (CudaDeviceCount(&why) == 0) {
    GTEST_SKIP() << "no CUDA device (" << why << "); these run on a GPU machine: ctest -L gpu";
  }
  auto made = MakeCudaBackend({.device = 0});
  ASSERT_TRUE(made.ok()) << made.status();
  Backend& gpu = **made;
  Tensor small = gpu.Zeros(DType::kFloat32, {1, 4});
  ASSERT_TRUE(gpu.status().ok());
  Tensor huge = gpu.Empty(DType::kFloat32, {int64_t{1} << 40});  // 4 TiB
  const absl::Status failed = gpu.status();
  EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted) << failed;
  EXPECT_NE(failed.message().find("out of memory on cuda:0: [1099511627776] fp32 needs "
                                  "4398046511104 bytes (4.00 TiB)"),
            std::string::npos)
      << failed;
  EXPECT_NE(failed.message().find(" free of "), std::string::npos) << failed;
  EXPECT_EQ(huge.shape(), (Shape{int64_t{1} << 40}));
  Tensor sum = gpu.Add(huge, huge);  // nothing launched on memory that is not there
  EXPECT_EQ(sum.shape(), huge.shape());
  Tensor y = gpu.Linear(small, gpu.Empty(DType::kFloat32, {3, 4}), Tensor());
  EXPECT_EQ(y.shape(), (Shape{1, 3}));
  std::vector<float> host(4);
  EXPECT_EQ(gpu.DownloadFloat(small, absl::MakeSpan(host)), failed);
  EXPECT_EQ(gpu.status(), failed);  // the first failure stays
  gpu.Synchronize();
  auto fresh = MakeCudaBackend({.device = 0});
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  Tensor ones = (*fresh)->Empty(DType::kFloat32, {4});
  ASSERT_TRUE((*fresh)->UploadFloat({1, 1, 1, 1}, ones).ok());
  Tensor two = (*fresh)->Add(ones, ones);
  ASSERT_TRUE((*fresh)->DownloadFloat(two, absl::MakeSpan(host)).ok());
  EXPECT_EQ(host, std::vector<float>(4, 2.0f));
}

// As the CPU backend counts (cpu_backend_test): what a device memory plan
// is checked against.
TEST(CudaBackendAllocationTest, CountsLiveAndPeakBytes) {
  std::string why;
  if (CudaDeviceCount(&why) == 0) {
    GTEST_SKIP() << "no CUDA device (" << why << "); these run on a GPU machine: ctest -L gpu";
  }
  auto made = MakeCudaBackend({.device = 0});
  ASSERT_TRUE(made.ok()) << made.status();
  Backend& gpu = **made;
  ASSERT_TRUE(gpu.allocation().has_value());
  const int64_t before = gpu.allocation()->live_bytes;
  {
    Tensor a = gpu.Empty(DType::kBFloat16, {3, 4});  // 24 bytes
    Tensor b = gpu.Zeros(DType::kFloat32, {5});      // 20
    Tensor shared = a;
    EXPECT_EQ(gpu.allocation()->live_bytes - before, 44);
    a = Tensor();
    shared = Tensor();
    EXPECT_EQ(gpu.allocation()->live_bytes - before, 20);
    EXPECT_GE(gpu.allocation()->peak_bytes - before, 44);
    gpu.ResetPeakAllocation();
    EXPECT_EQ(gpu.allocation()->peak_bytes - before, 20);
    Tensor c = gpu.Cast(b, DType::kFloat16);  // ops allocate through the same count
    EXPECT_EQ(gpu.allocation()->live_bytes - before, 30);
  }
  EXPECT_EQ(gpu.allocation()->live_bytes, before);
  EXPECT_EQ(gpu.allocation()->peak_bytes - before, 30);
  EXPECT_TRUE(gpu.status().ok()) << gpu.status();
}

TEST(CudaBackendFactoryTest, NamesAMissingDevice) {
  std::string why;
  const int count = CudaDeviceCount(&why);
  auto b = MakeCudaBackend({.device = count + 3});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(b.status().message().find("no CUDA device"), std::string::npos) << b.status();
}

}  // namespace
}  // namespace zo::backend
