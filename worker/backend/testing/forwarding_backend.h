// A Backend that hands every call to another one: tests derive from it and
// override the one call whose timing or failure they need to control (an
// upload a device would still be copying, a copy that fails), which the
// real backends cannot be made to do on demand.
#ifndef ZO_WORKER_BACKEND_TESTING_FORWARDING_BACKEND_H_
#define ZO_WORKER_BACKEND_TESTING_FORWARDING_BACKEND_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "worker/backend/backend.h"

namespace zo::backend::testing {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}

  std::string name() const override { return inner_.name(); }
  Tensor Empty(DType dtype, Shape shape) override { return inner_.Empty(dtype, std::move(shape)); }
  Tensor Zeros(DType dtype, Shape shape) override { return inner_.Zeros(dtype, std::move(shape)); }
  void SetZero(Tensor& t) override { inner_.SetZero(t); }
  absl::Status Upload(absl::Span<const std::byte> src, Tensor& dst) override {
    return inner_.Upload(src, dst);
  }
  absl::Status Download(const Tensor& src, absl::Span<std::byte> dst) override {
    return inner_.Download(src, dst);
  }
  absl::Status UploadFloat(absl::Span<const float> src, Tensor& dst) override {
    return inner_.UploadFloat(src, dst);
  }
  absl::Status DownloadFloat(const Tensor& src, absl::Span<float> dst) override {
    return inner_.DownloadFloat(src, dst);
  }
  absl::Status status() const override { return inner_.status(); }
  std::optional<int64_t> FreeDeviceMemory() const override { return inner_.FreeDeviceMemory(); }
  std::optional<Allocation> allocation() const override { return inner_.allocation(); }
  void ResetPeakAllocation() override { inner_.ResetPeakAllocation(); }
  std::shared_ptr<std::byte> AllocateHost(size_t bytes) override {
    return inner_.AllocateHost(bytes);
  }
  bool UploadsFromAnyHostMemory() const override { return inner_.UploadsFromAnyHostMemory(); }
  bool DownloadsToAnyHostMemory() const override { return inner_.DownloadsToAnyHostMemory(); }
  void DownloadAsync(const Tensor& src, absl::Span<std::byte> dst,
                     std::function<void(absl::Status)> done) override {
    inner_.DownloadAsync(src, dst, std::move(done));
  }
  void UploadAsync(absl::Span<const std::byte> src, Tensor& dst,
                   std::function<void(absl::Status)> done) override {
    inner_.UploadAsync(src, dst, std::move(done));
  }
  std::shared_ptr<const void> QueuedWorkMark() override { return inner_.QueuedWorkMark(); }
  void UploadAsyncAfter(absl::Span<const std::byte> src, Tensor& dst,
                        const std::shared_ptr<const void>& mark,
                        std::function<void(absl::Status)> done) override {
    inner_.UploadAsyncAfter(src, dst, mark, std::move(done));
  }
  DeviceSharing* sharing() override { return inner_.sharing(); }
  DeviceLinks* links() override { return inner_.links(); }
  Tensor Cast(const Tensor& src, DType dtype) override { return inner_.Cast(src, dtype); }
  void Synchronize() override { inner_.Synchronize(); }

  Tensor Linear(const Tensor& x, const Tensor& w, const Tensor& b) override {
    return inner_.Linear(x, w, b);
  }
  Tensor LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, bool want_dx,
                        Tensor& dw, Tensor* db) override {
    return inner_.LinearBackward(x, w, dy, want_dx, dw, db);
  }
  Tensor Embedding(absl::Span<const int32_t> tokens, int block_size, const Tensor& wte,
                   const Tensor& wpe) override {
    return inner_.Embedding(tokens, block_size, wte, wpe);
  }
  void EmbeddingBackward(absl::Span<const int32_t> tokens, int block_size, const Tensor& dy,
                         Tensor& dwte, Tensor& dwpe) override {
    inner_.EmbeddingBackward(tokens, block_size, dy, dwte, dwpe);
  }
  Tensor LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                   Tensor& mean, Tensor& rstd) override {
    return inner_.LayerNorm(x, gamma, beta, eps, mean, rstd);
  }
  Tensor LayerNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                           const Tensor& rstd, const Tensor& dy, Tensor& dgamma,
                           Tensor& dbeta) override {
    return inner_.LayerNormBackward(x, gamma, mean, rstd, dy, dgamma, dbeta);
  }
  Tensor Gelu(const Tensor& x) override { return inner_.Gelu(x); }
  Tensor GeluBackward(const Tensor& x, const Tensor& dy) override {
    return inner_.GeluBackward(x, dy);
  }
  Tensor Relu(const Tensor& x) override { return inner_.Relu(x); }
  Tensor ReluBackward(const Tensor& x, const Tensor& dy) override {
    return inner_.ReluBackward(x, dy);
  }
  Tensor Add(const Tensor& a, const Tensor& b) override { return inner_.Add(a, b); }
  void AddInto(const Tensor& x, Tensor& y) override { inner_.AddInto(x, y); }
  void CombineWeights(const Tensor& last, const Tensor& before, const Tensor& grad, float a,
                      float b, float c, Tensor& out) override {
    inner_.CombineWeights(last, before, grad, a, b, c, out);
  }
  Tensor Attention(const Tensor& qkv, int batch, int heads, Tensor& lse) override {
    return inner_.Attention(qkv, batch, heads, lse);
  }
  Tensor AttentionBackward(const Tensor& qkv, const Tensor& y, const Tensor& lse, const Tensor& dy,
                           int batch, int heads) override {
    return inner_.AttentionBackward(qkv, y, lse, dy, batch, heads);
  }
  Tensor CrossEntropy(const Tensor& logits, absl::Span<const int32_t> targets) override {
    return inner_.CrossEntropy(logits, targets);
  }
  Tensor CrossEntropyBackward(const Tensor& logits, absl::Span<const int32_t> targets,
                              float scale) override {
    return inner_.CrossEntropyBackward(logits, targets, scale);
  }

 protected:
  Backend& inner_;
};

}  // namespace zo::backend::testing

#endif  // ZO_WORKER_BACKEND_TESTING_FORWARDING_BACKEND_H_
