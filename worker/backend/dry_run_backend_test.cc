// The dry-run backend's ops give what the CPU backend's give, in shape,
// dtype and counted bytes, and its transfers check sizes as a real one does.
#include "worker/backend/dry_run_backend.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace zo::backend {
namespace {

constexpr int kBatch = 2, kT = 3, kC = 8, kHeads = 2, kVocab = 5;
constexpr int64_t kRows = kBatch * kT;

// One op's output on `b` from inputs made on `b`; undefined when the op
// returns nothing.
using Op = std::function<Tensor(Backend& b)>;

struct Named {
  std::string name;
  Op op;
};

std::vector<Named> Ops(DType dt) {
  const std::vector<int32_t> tokens(kRows, 1);
  auto x = [dt](Backend& b) { return b.Zeros(dt, {kRows, kC}); };
  auto w = [dt](Backend& b) { return b.Zeros(dt, {3 * kC, kC}); };
  auto vec = [](Backend& b) { return b.Zeros(DType::kFloat32, {kRows}); };
  return {
      {"Linear", [=](Backend& b) { return b.Linear(x(b), w(b), Tensor()); }},
      {"LinearBackward",
       [=](Backend& b) {
         Tensor dw = b.Zeros(DType::kFloat32, {3 * kC, kC});
         return b.LinearBackward(x(b), w(b), b.Zeros(dt, {kRows, 3 * kC}), true, dw, nullptr);
       }},
      {"Embedding",
       [=](Backend& b) {
         return b.Embedding(tokens, kT, b.Zeros(dt, {kVocab, kC}), b.Zeros(dt, {kT, kC}));
       }},
      {"LayerNorm",
       [=](Backend& b) {
         Tensor mean = vec(b), rstd = vec(b);
         return b.LayerNorm(x(b), b.Zeros(dt, {kC}), b.Zeros(dt, {kC}), 1e-5f, mean, rstd);
       }},
      {"LayerNormBackward",
       [=](Backend& b) {
         Tensor dg = b.Zeros(DType::kFloat32, {kC}), db = b.Zeros(DType::kFloat32, {kC});
         return b.LayerNormBackward(x(b), b.Zeros(dt, {kC}), vec(b), vec(b), x(b), dg, db);
       }},
      {"Gelu", [=](Backend& b) { return b.Gelu(x(b)); }},
      {"GeluBackward", [=](Backend& b) { return b.GeluBackward(x(b), x(b)); }},
      {"Relu", [=](Backend& b) { return b.Relu(x(b)); }},
      {"ReluBackward", [=](Backend& b) { return b.ReluBackward(x(b), x(b)); }},
      {"Add", [=](Backend& b) { return b.Add(x(b), x(b)); }},
      {"Attention",
       [=](Backend& b) {
         Tensor lse = b.Empty(DType::kFloat32, {kBatch, kHeads, kT});
         return b.Attention(b.Zeros(dt, {kRows, 3 * kC}), kBatch, kHeads, lse);
       }},
      {"AttentionBackward",
       [=](Backend& b) {
         return b.AttentionBackward(b.Zeros(dt, {kRows, 3 * kC}), x(b),
                                    b.Zeros(DType::kFloat32, {kBatch, kHeads, kT}), x(b), kBatch,
                                    kHeads);
       }},
      {"CrossEntropy",
       [=](Backend& b) {
         return b.CrossEntropy(b.Zeros(dt, {kRows, kVocab}), std::vector<int32_t>(kRows, 0));
       }},
      {"CrossEntropyBackward",
       [=](Backend& b) {
         return b.CrossEntropyBackward(b.Zeros(dt, {kRows, kVocab}), std::vector<int32_t>(kRows, 0),
                                       1.0f);
       }},
      {"Cast", [=](Backend& b) { return b.Cast(x(b), DType::kFloat32); }},
  };
}

TEST(DryRunBackendTest, OpsGiveWhatTheCpuBackendGives) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    for (const Named& named : Ops(dt)) {
      std::unique_ptr<Backend> cpu = MakeCpuBackend({.blas_threads = 1});
      DryRunBackend dry;
      const Tensor want = named.op(*cpu);
      const Tensor got = named.op(dry);
      const std::string what = named.name + " " + std::string(DTypeName(dt));
      ASSERT_EQ(got.defined(), want.defined()) << what;
      EXPECT_EQ(got.shape(), want.shape()) << what;
      EXPECT_EQ(got.dtype(), want.dtype()) << what;
      EXPECT_EQ(dry.allocation()->live_bytes, cpu->allocation()->live_bytes) << what;
      EXPECT_EQ(dry.allocation()->peak_bytes, cpu->allocation()->peak_bytes) << what;
    }
  }
}

TEST(DryRunBackendTest, TensorsFreeTheirCountAndTransfersCheckSizes) {
  DryRunBackend dry;
  {
    Tensor t = dry.Empty(DType::kFloat16, {4, 2});
    EXPECT_EQ(dry.allocation()->live_bytes, 16);
    std::vector<std::byte> bytes(16, std::byte{7});
    EXPECT_TRUE(dry.Upload(bytes, t).ok());
    EXPECT_TRUE(dry.Download(t, absl::MakeSpan(bytes)).ok());
    EXPECT_EQ(bytes[3], std::byte{0});
    EXPECT_EQ(dry.Upload(absl::MakeSpan(bytes).subspan(1), t).code(),
              absl::StatusCode::kInvalidArgument);
    std::vector<float> values(7);
    EXPECT_EQ(dry.DownloadFloat(t, absl::MakeSpan(values)).code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(dry.allocation()->live_bytes, 0);
  EXPECT_EQ(dry.allocation()->peak_bytes, 16);
  dry.ResetPeakAllocation();
  EXPECT_EQ(dry.allocation()->peak_bytes, 0);
}

}  // namespace
}  // namespace zo::backend
