#include "worker/model/param_window.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "common/wake_queue.h"

namespace zo::model {
namespace {

// The next use of a layer fetched no more this step.
constexpr size_t kNever = std::numeric_limits<size_t>::max();

}  // namespace

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

ParamWindow::~ParamWindow() { (void)Settle(); }

void ParamWindow::Reset(std::map<const Param*, absl::Span<const std::byte>> host, bool unchanged) {
  // A failed prefetch drops its layer; the others stay only if the bytes do.
  (void)Settle();
  const bool same_places =
      unchanged && read_ == nullptr && host.size() == host_.size() &&
      std::equal(host.begin(), host.end(), host_.begin(), [](const auto& a, const auto& b) {
        return a.first == b.first && a.second.data() == b.second.data() &&
               a.second.size() == b.second.size();
      });
  host_ = std::move(host);
  read_ = nullptr;
  BeginStep(same_places);
}

void ParamWindow::Reset(HostWeightReader read, bool unchanged) {
  (void)Settle();
  const bool keep = unchanged && read_ != nullptr;
  host_.clear();
  read_ = std::move(read);
  BeginStep(keep);
}

void ParamWindow::BeginStep(bool keep) {
  if (!keep) {
    while (!resident_.empty()) Drop(resident_.front());
  }
  // The step that ended gives the order the next one is expected to keep.
  if (!this_step_.empty()) {
    order_ = std::move(this_step_);
    this_step_.clear();
    next_same_.assign(order_.size(), kNever);
    std::map<const Layer*, size_t> later;
    for (size_t i = order_.size(); i-- > 0;) {
      auto it = later.find(order_[i]);
      if (it != later.end()) next_same_[i] = it->second;
      later[order_[i]] = i;
    }
  }
  following_ = !order_.empty();
  next_use_.clear();
}

void ParamWindow::Record(Layer& layer) {
  const size_t at = this_step_.size();
  this_step_.push_back(&layer);
  if (!following_) return;
  if (at >= order_.size() || order_[at] != &layer) {
    following_ = false;  // a different order: least recently used from here
    return;
  }
  next_use_[&layer] = next_same_[at];
}

Layer* ParamWindow::Victim(const Layer* keep) const {
  Layer* victim = nullptr;
  size_t furthest = 0;
  for (Layer* layer : resident_) {  // least recently used first
    if (layer == keep) continue;
    if (!following_) return layer;
    // A layer this step has not fetched yet is used at its first position.
    auto it = next_use_.find(layer);
    size_t next = kNever;
    if (it != next_use_.end()) {
      next = it->second;
    } else {
      auto first =
          std::find(order_.begin() + static_cast<long>(this_step_.size()), order_.end(), layer);
      next = first == order_.end() ? kNever : static_cast<size_t>(first - order_.begin());
    }
    if (victim == nullptr || next > furthest) {
      victim = layer;
      furthest = next;
    }
  }
  return victim;
}

bool ParamWindow::IsResident(const Layer& layer) const {
  return std::find(resident_.begin(), resident_.end(), &layer) != resident_.end();
}

absl::StatusOr<std::vector<absl::Span<const std::byte>>> ParamWindow::HostCopies(const Layer& layer,
                                                                                 int slot) const {
  std::vector<absl::Span<const std::byte>> copies;
  if (read_ != nullptr) {
    std::vector<const Param*> params;
    for (const Param& p : layer.params()) params.push_back(&p);
    ZO_ASSIGN_OR_RETURN(copies, read_(params, slot));
    if (copies.size() != params.size()) {
      return absl::InternalError(absl::StrCat("the host weight reader gave ", copies.size(),
                                              " copies for ", layer.name(), "'s ", params.size(),
                                              " params"));
    }
    return copies;
  }
  for (const Param& p : layer.params()) {
    auto host = host_.find(&p);
    if (host == host_.end()) {
      return absl::InternalError(
          absl::StrCat("no host copy of ", p.name, "'s weights for the stage's window"));
    }
    copies.push_back(host->second);
  }
  return copies;
}

void ParamWindow::Drop(Layer* layer) {
  resident_.remove(layer);
  resident_bytes_ -= LayerBytes(*layer, dtype_);
  // The memory goes back to the backend (a device backend frees it once the
  // work queued on it is done).
  for (Param& p : layer->params()) p.value = backend::Tensor();
}

absl::Status ParamWindow::Settle() {
  if (in_flight_ == nullptr) return absl::OkStatus();
  const std::shared_ptr<InFlight> flight = std::move(in_flight_);
  absl::Status status;
  {
    std::unique_lock<std::mutex> lock(flight->mu);
    flight->done.wait(lock, [&] { return flight->outstanding == 0; });
    status = flight->status;
  }
  if (!status.ok() && IsResident(*flight->layer)) Drop(flight->layer);
  return status;
}

absl::Status ParamWindow::Fetch(Layer& layer) {
  ZO_RETURN_IF_ERROR(Settle());
  Record(layer);
  if (auto it = std::find(resident_.begin(), resident_.end(), &layer); it != resident_.end()) {
    resident_.splice(resident_.end(), resident_, it);  // now the most recently used
    return absl::OkStatus();
  }
  const int64_t bytes = LayerBytes(layer, dtype_);
  while (!resident_.empty() && resident_bytes_ + bytes > budget_bytes_) Drop(Victim(nullptr));
  if (bytes > budget_bytes_) return CheckFits({&layer});
  ZO_ASSIGN_OR_RETURN(const std::vector<absl::Span<const std::byte>> host,
                      HostCopies(layer, /*slot=*/0));
  if (read_ == nullptr) {
    size_t i = 0;
    for (Param& p : layer.params()) {
      p.value = backend_.Empty(dtype_, p.shape);
      ZO_RETURN_IF_ERROR(backend_.Upload(host[i++], p.value));
    }
  } else {
    // Slot 0 is read again by the next Fetch: its copies must be done (a
    // device backend's Upload from page-locked memory returns before).
    std::vector<backend::Tensor*> dst;
    for (Param& p : layer.params()) {
      p.value = backend_.Empty(dtype_, p.shape);
      dst.push_back(&p.value);
    }
    if (absl::Status uploaded = backend::UploadAll(backend_, host, dst); !uploaded.ok()) {
      for (Param& p : layer.params()) p.value = backend::Tensor();
      return uploaded;
    }
  }
  resident_.push_back(&layer);
  resident_bytes_ += bytes;
  peak_resident_bytes_ = std::max(peak_resident_bytes_, resident_bytes_);
  ++fetches_;
  return absl::OkStatus();
}

absl::Status ParamWindow::Prefetch(Layer* hint, const Layer& in_use) {
  const size_t at = this_step_.size();
  Layer* const following = following_ && at < order_.size() ? order_[at] : nullptr;
  if (following_) hint = following;
  if (hint == nullptr || hint == &in_use) return absl::OkStatus();
  Layer& next = *hint;
  if (IsResident(next)) return absl::OkStatus();  // on the device, or on its way
  const int64_t bytes = LayerBytes(next, dtype_);
  const int64_t in_use_bytes = IsResident(in_use) ? LayerBytes(in_use, dtype_) : 0;
  if (in_use_bytes + bytes > budget_bytes_) return absl::OkStatus();  // no room beside it
  ZO_RETURN_IF_ERROR(Settle());
  std::vector<absl::Span<const std::byte>> host;
  if (read_ == nullptr) {
    ZO_ASSIGN_OR_RETURN(host, HostCopies(next, /*slot=*/1));
  }
  while (resident_bytes_ + bytes > budget_bytes_) Drop(Victim(&in_use));
  auto flight = std::make_shared<InFlight>();
  flight->layer = &next;
  flight->outstanding = static_cast<int>(next.params().size());
  in_flight_ = flight;
  resident_.push_back(&next);
  resident_bytes_ += bytes;
  peak_resident_bytes_ = std::max(peak_resident_bytes_, resident_bytes_);
  ++fetches_;
  ++prefetches_;
  // Allocated here, on the stage's thread, whoever uploads into them.
  std::vector<backend::Tensor*> dst;
  for (Param& p : next.params()) {
    p.value = backend_.Empty(dtype_, p.shape);
    dst.push_back(&p.value);
  }
  auto uploaded = [flight](absl::Status s) { FinishPart(*flight, std::move(s), 1); };
  if (read_ == nullptr) {
    for (size_t i = 0; i < dst.size(); ++i) backend_.UploadAsync(host[i], *dst[i], uploaded);
    return absl::OkStatus();
  }
  // From a file the read goes on beside the compute too, on the window's
  // reader thread, and the uploads start from there once it is done.
  // Nothing else reads slot 1 or touches these tensors before Settle.
  if (reader_ == nullptr) reader_ = std::make_unique<WakeQueue>();
  std::vector<const Param*> params;
  for (const Param& p : next.params()) params.push_back(&p);
  reader_->Post(
      {[this, flight, read = read_, params = std::move(params), dst = std::move(dst), uploaded] {
        absl::StatusOr<std::vector<absl::Span<const std::byte>>> copies = read(params, /*slot=*/1);
        if (copies.ok() && copies->size() != dst.size()) {
          copies = absl::InternalError("the host weight reader gave the wrong number of copies");
        }
        if (!copies.ok()) {
          FinishPart(*flight, copies.status(), static_cast<int>(dst.size()));
          return;
        }
        for (size_t i = 0; i < dst.size(); ++i)
          backend_.UploadAsync((*copies)[i], *dst[i], uploaded);
      }});
  return absl::OkStatus();
}

void ParamWindow::FinishPart(InFlight& flight, absl::Status status, int parts) {
  std::lock_guard<std::mutex> lock(flight.mu);
  if (!status.ok() && flight.status.ok()) flight.status = std::move(status);
  flight.outstanding -= parts;
  if (flight.outstanding == 0) flight.done.notify_all();
}

}  // namespace zo::model
