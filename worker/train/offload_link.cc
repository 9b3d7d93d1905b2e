#include "worker/train/offload_link.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/param.h"

namespace zo::train {

OffloadLink::OffloadLink(OffloadClient* client, backend::Backend& backend,
                         const std::vector<TensorSpec>& manifest, DType dtype)
    : client_(client), backend_(backend), dtype_(dtype) {
  for (int i = 0; i < static_cast<int>(manifest.size()); ++i) index_[manifest[i].name] = i;
}

OffloadLink::~OffloadLink() {
  std::unique_lock<std::mutex> lock(mu_);
  copied_.wait(lock, [this] { return copies_in_flight_ == 0; });
}

absl::StatusOr<int> OffloadLink::TensorIndex(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::InternalError(absl::StrCat("parameter '", name, "' is not in the manifest"));
  }
  return it->second;
}

absl::Status OffloadLink::InitializeIfFresh(absl::Span<model::Param* const> params, uint64_t seed) {
  if (client_->version() != 0) return absl::OkStatus();
  for (model::Param* p : params) {
    ZO_ASSIGN_OR_RETURN(int index, TensorIndex(p->name));
    ZO_RETURN_IF_ERROR(client_->InitParams(index, model::InitialValues(*p, seed)));
  }
  return absl::OkStatus();
}

absl::Status OffloadLink::LoadWeights(int64_t step, absl::Span<model::Param* const> params) {
  if (weights_.size() != params.size()) {
    weights_.clear();
    pulled_tensors_.clear();
    size_t gradient_bytes = 0;
    for (model::Param* p : params) {
      ZO_ASSIGN_OR_RETURN(int index, TensorIndex(p->name));
      pulled_tensors_.push_back(index);
      weights_.emplace_back(static_cast<size_t>(p->value.nbytes()));
      gradient_bytes += static_cast<size_t>(p->numel()) * DTypeSize(dtype_);
    }
    if (gradient_bytes > arena_bytes_) {
      arena_ = backend_.AllocateHost(gradient_bytes);
      arena_bytes_ = gradient_bytes;
    }
  }
  std::vector<absl::Span<std::byte>> dst(weights_.begin(), weights_.end());
  ZO_ASSIGN_OR_RETURN(bool changed, client_->PullForStep(step, pulled_tensors_, dst));
  // Where DPU starts (two steps on one version) and after a skipped step
  // the weights stay: no copy to the device.
  if (!changed && uploaded_) return absl::OkStatus();
  for (size_t i = 0; i < params.size(); ++i) {
    ZO_RETURN_IF_ERROR(backend_.Upload(weights_[i], params[i]->value));
  }
  uploaded_ = true;
  return absl::OkStatus();
}

double OffloadLink::LossScale(int64_t) { return client_->loss_scale(); }

absl::Status OffloadLink::PushGradient(int64_t step, const model::Param& param) {
  ZO_ASSIGN_OR_RETURN(int index, TensorIndex(param.name));
  // fp32 -> fp16 turns an overflowing gradient into inf: that is how the
  // servers see the overflow and skip the step.
  backend::Tensor low = backend_.Cast(param.grad, dtype_);
  const size_t bytes = static_cast<size_t>(low.nbytes());
  if (step != arena_step_) {
    arena_step_ = step;
    arena_used_ = 0;
  }
  if (arena_used_ + bytes > arena_bytes_) {
    return absl::InternalError(absl::StrCat("gradient '", param.name, "' of step ", step,
                                            " does not fit the staging arena (", arena_bytes_,
                                            " bytes, ", arena_used_, " used): pushed twice?"));
  }
  const absl::Span<std::byte> dst(arena_.get() + arena_used_, bytes);
  arena_used_ += bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!copy_error_.ok()) return copy_error_;
    ++copies_in_flight_;
  }
  // The bytes go to the client once on the host; the arena lives while the
  // client holds them.
  std::shared_ptr<const void> owner(arena_, dst.data());
  OffloadClient* client = client_;
  backend_.DownloadAsync(low, dst, [this, client, step, index, owner, dst](absl::Status s) {
    if (s.ok()) s = client->PushShared(step, index, owner, dst);
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ok() && copy_error_.ok()) copy_error_ = s;
    --copies_in_flight_;
    copied_.notify_all();
  });
  return absl::OkStatus();
}

absl::Status OffloadLink::FinishStep(int64_t step) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    copied_.wait(lock, [this] { return copies_in_flight_ == 0; });
    if (!copy_error_.ok()) return std::exchange(copy_error_, absl::OkStatus());
  }
  return client_->FinishStep(step);
}

}  // namespace zo::train
