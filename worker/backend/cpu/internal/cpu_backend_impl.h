// The CPU backend's class, shared by the files that implement its ops
// (one file per op family: memory in cpu_backend.cc, then linear.cc,
// embedding.cc, layer_norm.cc, pointwise.cc, attention.cc, cross_entropy.cc).
#ifndef ZO_WORKER_BACKEND_CPU_INTERNAL_CPU_BACKEND_IMPL_H_
#define ZO_WORKER_BACKEND_CPU_INTERNAL_CPU_BACKEND_IMPL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "worker/backend/allocation_counter.h"
#include "worker/backend/backend.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/cpu/internal/host_sharing.h"

namespace zo::backend::cpu {

// The fp32 values of a CPU tensor (see cpu_backend.h: every dtype is held as
// fp32 values representable in it).
inline float* Data(const Tensor& t) { return static_cast<float*>(t.storage()); }

// Rounds n values in place to what `dtype` can hold (round to nearest even);
// nothing to do for fp32.
void RoundTo(DType dtype, float* values, int64_t n);

// Prints "<op>: <what>" and aborts: a shape mismatch is a bug in the calling
// model, not bad user input.
[[noreturn]] void ShapeError(const char* op, const std::string& what);

// ShapeError(op, describe()) when `ok` is false. The message is built only
// then: some checks run per token, and formatting shapes every time cost a
// string per call on the hot path.
template <typename Describe>
void CheckShape(bool ok, const char* op, Describe&& describe) {
  if (!ok) [[unlikely]]
    ShapeError(op, describe());
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options);

  std::string name() const override { return "cpu"; }

  Tensor Empty(DType dtype, Shape shape) override;
  std::optional<Allocation> allocation() const override;
  void ResetPeakAllocation() override;
  Tensor Zeros(DType dtype, Shape shape) override;
  void SetZero(Tensor& t) override;
  absl::Status Upload(absl::Span<const std::byte> src, Tensor& dst) override;
  absl::Status Download(const Tensor& src, absl::Span<std::byte> dst) override;
  absl::Status UploadFloat(absl::Span<const float> src, Tensor& dst) override;
  absl::Status DownloadFloat(const Tensor& src, absl::Span<float> dst) override;
  Tensor Cast(const Tensor& src, DType dtype) override;
  void Synchronize() override {}

  Tensor Linear(const Tensor& x, const Tensor& w, const Tensor& b) override;
  Tensor LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, bool want_dx,
                        Tensor& dw, Tensor* db) override;
  Tensor Embedding(absl::Span<const int32_t> tokens, int block_size, const Tensor& wte,
                   const Tensor& wpe) override;
  void EmbeddingBackward(absl::Span<const int32_t> tokens, int block_size, const Tensor& dy,
                         Tensor& dwte, Tensor& dwpe) override;
  Tensor LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                   Tensor& mean, Tensor& rstd) override;
  Tensor LayerNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                           const Tensor& rstd, const Tensor& dy, Tensor& dgamma,
                           Tensor& dbeta) override;
  Tensor Gelu(const Tensor& x) override;
  Tensor GeluBackward(const Tensor& x, const Tensor& dy) override;
  Tensor Relu(const Tensor& x) override;
  Tensor ReluBackward(const Tensor& x, const Tensor& dy) override;
  Tensor Add(const Tensor& a, const Tensor& b) override;
  void AddInto(const Tensor& x, Tensor& y) override;
  void CombineWeights(const Tensor& last, const Tensor& before, const Tensor& grad, float a,
                      float b, float c, Tensor& out) override;
  Tensor Attention(const Tensor& qkv, int batch, int heads, Tensor& lse) override;
  Tensor AttentionBackward(const Tensor& qkv, const Tensor& y, const Tensor& lse, const Tensor& dy,
                           int batch, int heads) override;
  Tensor CrossEntropy(const Tensor& logits, absl::Span<const int32_t> targets) override;
  Tensor CrossEntropyBackward(const Tensor& logits, absl::Span<const int32_t> targets,
                              float scale) override;
  DeviceSharing* sharing() override { return &sharing_; }

 private:
  std::shared_ptr<AllocationCounter> counts_ = std::make_shared<AllocationCounter>();
  HostSharing sharing_{*this};
};

}  // namespace zo::backend::cpu

#endif  // ZO_WORKER_BACKEND_CPU_INTERNAL_CPU_BACKEND_IMPL_H_
