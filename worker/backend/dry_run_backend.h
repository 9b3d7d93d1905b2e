// A backend that computes nothing and holds no memory: every op returns a
// tensor of the shape and dtype the CPU backend's would, and the tensors
// are counted as the CPU backend counts them (allocation()). What a plan of
// a device's memory runs a whole step on (worker/model/device_memory_plan.h):
// it sees the real layers, schedule and stage allocate and free, at no cost.
//
// Downloads write zeros; uploads check sizes only. Thread-safe as the CPU
// backend is. Not final: a test derives from it to hold back the completion
// of asynchronous copies (param_window_test).
#ifndef ZO_WORKER_BACKEND_DRY_RUN_BACKEND_H_
#define ZO_WORKER_BACKEND_DRY_RUN_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/backend/allocation_counter.h"
#include "worker/backend/backend.h"

namespace zo::backend {

class DryRunBackend : public Backend {
 public:
  DryRunBackend();

  std::string name() const override { return "dry-run"; }

  Tensor Empty(DType dtype, Shape shape) override;
  Tensor Zeros(DType dtype, Shape shape) override { return Empty(dtype, std::move(shape)); }
  void SetZero(Tensor&) override {}
  absl::Status Upload(absl::Span<const std::byte> src, Tensor& dst) override;
  absl::Status Download(const Tensor& src, absl::Span<std::byte> dst) override;
  absl::Status UploadFloat(absl::Span<const float> src, Tensor& dst) override;
  absl::Status DownloadFloat(const Tensor& src, absl::Span<float> dst) override;
  std::optional<Allocation> allocation() const override;
  void ResetPeakAllocation() override;
  Tensor Cast(const Tensor& src, DType dtype) override { return Empty(dtype, src.shape()); }
  void Synchronize() override {}

  Tensor Linear(const Tensor& x, const Tensor& w, const Tensor& b) override;
  Tensor LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, bool want_dx,
                        Tensor& dw, Tensor* db) override;
  Tensor Embedding(absl::Span<const int32_t> tokens, int block_size, const Tensor& wte,
                   const Tensor& wpe) override;
  void EmbeddingBackward(absl::Span<const int32_t>, int, const Tensor&, Tensor&, Tensor&) override {
  }
  Tensor LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                   Tensor& mean, Tensor& rstd) override;
  Tensor LayerNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                           const Tensor& rstd, const Tensor& dy, Tensor& dgamma,
                           Tensor& dbeta) override;
  Tensor Gelu(const Tensor& x) override { return Like(x); }
  Tensor GeluBackward(const Tensor& x, const Tensor&) override { return Like(x); }
  Tensor Relu(const Tensor& x) override { return Like(x); }
  Tensor ReluBackward(const Tensor& x, const Tensor&) override { return Like(x); }
  Tensor Add(const Tensor& a, const Tensor&) override { return Like(a); }
  void AddInto(const Tensor&, Tensor&) override {}
  void CombineWeights(const Tensor&, const Tensor&, const Tensor&, float, float, float,
                      Tensor&) override {}
  Tensor Attention(const Tensor& qkv, int batch, int heads, Tensor& lse) override;
  Tensor AttentionBackward(const Tensor& qkv, const Tensor& y, const Tensor& lse, const Tensor& dy,
                           int batch, int heads) override;
  Tensor CrossEntropy(const Tensor& logits, absl::Span<const int32_t> targets) override;
  Tensor CrossEntropyBackward(const Tensor& logits, absl::Span<const int32_t> targets,
                              float scale) override;

 private:
  Tensor Like(const Tensor& x) { return Empty(x.dtype(), x.shape()); }

  std::shared_ptr<AllocationCounter> counts_;
};

}  // namespace zo::backend

#endif  // ZO_WORKER_BACKEND_DRY_RUN_BACKEND_H_
