#include "worker/train/offload_link.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/param.h"

namespace zo::train {

OffloadLink::OffloadLink(OffloadClient* client, backend::Backend& backend,
                         const std::vector<TensorSpec>& manifest, DType dtype)
    : client_(client), backend_(backend), dtype_(dtype) {
  for (int i = 0; i < static_cast<int>(manifest.size()); ++i) index_[manifest[i].name] = i;
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
    for (model::Param* p : params) {
      ZO_ASSIGN_OR_RETURN(int index, TensorIndex(p->name));
      pulled_tensors_.push_back(index);
      weights_.emplace_back(static_cast<size_t>(p->value.nbytes()));
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
  // A fresh staging buffer handed to the client: sent in place, freed when
  // gRPC has written it.
  auto bytes = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(low.nbytes()));
  ZO_RETURN_IF_ERROR(backend_.Download(low, absl::MakeSpan(*bytes)));
  const absl::Span<const std::byte> view(*bytes);
  return client_->PushShared(step, index, std::move(bytes), view);
}

absl::Status OffloadLink::FinishStep(int64_t step) { return client_->FinishStep(step); }

}  // namespace zo::train
