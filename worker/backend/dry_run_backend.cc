#include "worker/backend/dry_run_backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zo::backend {
namespace {

// Every tensor's storage: defined() needs a pointer, and nothing reads it.
std::byte kNoStorage;

absl::Status CheckBytes(const char* op, const Tensor& t, size_t bytes) {
  if (static_cast<int64_t>(bytes) == t.nbytes()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", bytes, " bytes for a tensor of ",
                                                 ShapeString(t.shape()), " (", t.nbytes(),
                                                 " bytes)"));
}

}  // namespace

DryRunBackend::DryRunBackend() : counts_(std::make_shared<AllocationCounter>()) {}

Tensor DryRunBackend::Empty(DType dtype, Shape shape) {
  // Counted as the CPU backend counts: the elements at the dtype's size.
  const int64_t counted = NumElements(shape) * static_cast<int64_t>(DTypeSize(dtype));
  counts_->Allocated(counted);
  std::shared_ptr<void> storage(static_cast<void*>(&kNoStorage),
                                [counts = counts_, counted](void*) { counts->Freed(counted); });
  return Tensor(dtype, std::move(shape), std::move(storage));
}

absl::Status DryRunBackend::Upload(absl::Span<const std::byte> src, Tensor& dst) {
  return CheckBytes("Upload", dst, src.size());
}

absl::Status DryRunBackend::Download(const Tensor& src, absl::Span<std::byte> dst) {
  ZO_RETURN_IF_ERROR(CheckBytes("Download", src, dst.size()));
  std::fill(dst.begin(), dst.end(), std::byte{0});
  return absl::OkStatus();
}

absl::Status DryRunBackend::UploadFloat(absl::Span<const float> src, Tensor& dst) {
  if (static_cast<int64_t>(src.size()) == dst.numel()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "UploadFloat: ", src.size(), " values for a tensor of ", ShapeString(dst.shape())));
}

absl::Status DryRunBackend::DownloadFloat(const Tensor& src, absl::Span<float> dst) {
  if (static_cast<int64_t>(dst.size()) != src.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DownloadFloat: ", dst.size(), " values for a tensor of ", ShapeString(src.shape())));
  }
  std::fill(dst.begin(), dst.end(), 0.0f);
  return absl::OkStatus();
}

std::optional<Backend::Allocation> DryRunBackend::allocation() const { return counts_->Get(); }

void DryRunBackend::ResetPeakAllocation() { counts_->ResetPeak(); }

Tensor DryRunBackend::Linear(const Tensor& x, const Tensor& w, const Tensor&) {
  return Empty(x.dtype(), {x.dim(0), w.dim(0)});
}

Tensor DryRunBackend::LinearBackward(const Tensor& x, const Tensor& w, const Tensor&, bool want_dx,
                                     Tensor&, Tensor*) {
  return want_dx ? Empty(x.dtype(), {x.dim(0), w.dim(1)}) : Tensor();
}

Tensor DryRunBackend::Embedding(absl::Span<const int32_t> tokens, int, const Tensor& wte,
                                const Tensor&) {
  return Empty(wte.dtype(), {static_cast<int64_t>(tokens.size()), wte.dim(1)});
}

Tensor DryRunBackend::LayerNorm(const Tensor& x, const Tensor&, const Tensor&, float, Tensor&,
                                Tensor&) {
  return Like(x);
}

Tensor DryRunBackend::LayerNormBackward(const Tensor& x, const Tensor&, const Tensor&,
                                        const Tensor&, const Tensor&, Tensor&, Tensor&) {
  return Like(x);
}

Tensor DryRunBackend::Attention(const Tensor& qkv, int, int, Tensor&) {
  return Empty(qkv.dtype(), {qkv.dim(0), qkv.dim(1) / 3});
}

Tensor DryRunBackend::AttentionBackward(const Tensor& qkv, const Tensor&, const Tensor&,
                                        const Tensor&, int, int) {
  return Like(qkv);
}

Tensor DryRunBackend::CrossEntropy(const Tensor&, absl::Span<const int32_t>) {
  return Empty(DType::kFloat32, {1});
}

Tensor DryRunBackend::CrossEntropyBackward(const Tensor& logits, absl::Span<const int32_t>, float) {
  return Like(logits);
}

}  // namespace zo::backend
