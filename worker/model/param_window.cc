#include "worker/model/param_window.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/units.h"

namespace zo::model {

ParamWindow::ParamWindow(backend::Backend& backend, DType dtype, int64_t budget_bytes)
    : backend_(backend), dtype_(dtype), budget_bytes_(budget_bytes) {}

int64_t ParamWindow::LayerBytes(const Layer& layer, DType dtype) {
  return layer.param_count() * static_cast<int64_t>(DTypeSize(dtype));
}

absl::Status ParamWindow::CheckFits(absl::Span<const Layer* const> layers) const {
  for (const Layer* layer : layers) {
    const int64_t bytes = LayerBytes(*layer, dtype_);
    if (bytes > budget_bytes_) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layer->name(), " needs ", FormatBytes(bytes), " of ",
                       std::string(DTypeName(dtype_)), " weights on the device, more than the ",
                       FormatBytes(budget_bytes_), " its stage may keep at once"));
    }
  }
  return absl::OkStatus();
}

void ParamWindow::Reset(std::map<const Param*, absl::Span<const std::byte>> host) {
  while (!resident_.empty()) Drop(resident_.front());
  host_ = std::move(host);
}

void ParamWindow::Drop(Layer* layer) {
  resident_.remove(layer);
  resident_bytes_ -= LayerBytes(*layer, dtype_);
  // The memory goes back to the backend (a device backend frees it once the
  // work queued on it is done).
  for (Param& p : layer->params()) p.value = backend::Tensor();
}

absl::Status ParamWindow::Fetch(Layer& layer) {
  if (auto it = std::find(resident_.begin(), resident_.end(), &layer); it != resident_.end()) {
    resident_.splice(resident_.end(), resident_, it);  // now the most recently used
    return absl::OkStatus();
  }
  const int64_t bytes = LayerBytes(layer, dtype_);
  while (!resident_.empty() && resident_bytes_ + bytes > budget_bytes_) Drop(resident_.front());
  if (bytes > budget_bytes_) return CheckFits({&layer});
  for (Param& p : layer.params()) {
    auto host = host_.find(&p);
    if (host == host_.end()) {
      return absl::InternalError(
          absl::StrCat("no host copy of ", p.name, "'s weights for the stage's window"));
    }
    p.value = backend_.Empty(dtype_, p.shape);
    ZO_RETURN_IF_ERROR(backend_.Upload(host->second, p.value));
  }
  resident_.push_back(&layer);
  resident_bytes_ += bytes;
  peak_resident_bytes_ = std::max(peak_resident_bytes_, resident_bytes_);
  ++fetches_;
  return absl::OkStatus();
}

}  // namespace zo::model
