#include "worker/train/offload_link.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/dpu_policy.h"
#include "common/status_macros.h"
#include "worker/model/param.h"

namespace zo::train {

OffloadLink::OffloadLink(OffloadClient* client, backend::Backend& backend,
                         const std::vector<TensorSpec>& manifest, DType dtype)
    : client_(client), backend_(backend), dtype_(dtype) {
  for (int i = 0; i < static_cast<int>(manifest.size()); ++i) index_[manifest[i].name] = i;
}

OffloadLink::~OffloadLink() {
  CancelPrefetch();
  std::unique_lock<std::mutex> lock(mu_);
  copied_.wait(lock, [this] { return copies_in_flight_ == 0; });
}

void OffloadLink::set_client(OffloadClient* client) {
  JoinPrefetch();
  client_ = client;
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

absl::Status OffloadLink::Prepare(absl::Span<model::Param* const> params, bool streaming) {
  if (!params_.empty()) {
    if (streaming != streaming_ || params.size() != params_.size() ||
        !std::equal(params.begin(), params.end(), params_.begin())) {
      return absl::InternalError("a stage's parameters changed between steps");
    }
    return absl::OkStatus();
  }
  streaming_ = streaming;
  // Weights and gradients both cross in the job's dtype.
  size_t bytes_16 = 0;
  for (model::Param* p : params) {
    ZO_ASSIGN_OR_RETURN(int index, TensorIndex(p->name));
    pulled_tensors_.push_back(index);
    bytes_16 += static_cast<size_t>(p->numel()) * DTypeSize(dtype_);
  }
  const size_t weight_bytes = bytes_16, gradient_bytes = bytes_16;
  params_.assign(params.begin(), params.end());
  if (streaming_ && streamed_weights() == StreamedWeights::kFile) {
    ZO_RETURN_IF_ERROR(PrepareFile());
  } else if (streaming_ && streamed_weights() == StreamedWeights::kServers) {
    from_servers_ = true;
    for (size_t i = 0; i < params_.size(); ++i) {
      param_index_[params_[i]] = i;
      if (params_[i]->numel() > 0 &&
          (smallest_ < 0 || params_[i]->numel() < params_[smallest_]->numel())) {
        smallest_ = static_cast<int>(i);
      }
    }
    if (smallest_ >= 0) {
      smallest_bytes_.resize(static_cast<size_t>(params_[smallest_]->numel()) * DTypeSize(dtype_));
    }
  } else {
    host_arena_ = backend_.AllocateHost(weight_bytes);
    size_t offset = 0;
    for (model::Param* p : params_) {
      const size_t bytes = static_cast<size_t>(p->numel()) * DTypeSize(dtype_);
      host_.emplace_back(host_arena_.get() + offset, bytes);
      offset += bytes;
      if (!streaming_) idle_.push_back(backend_.Empty(dtype_, p->shape));
    }
  }
  slots_ = PushesPerRank(client_->config()) > 1 ? 2 : 1;
  slot_bytes_ = gradient_bytes;
  staging_ = std::make_shared<Staging>();
  staging_->arena = backend_.AllocateHost(gradient_bytes * static_cast<size_t>(slots_));
  staging_->busy.assign(params_.size() * static_cast<size_t>(slots_), 0);
  size_t at = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    places_[pulled_tensors_[i]] = {static_cast<int>(i), at};
    at += static_cast<size_t>(params_[i]->numel()) * DTypeSize(dtype_);
  }
  // Versions up to the job's are there to pull.
  pushed_ = client_->version();
  return absl::OkStatus();
}

int64_t OffloadLink::host_bytes() const {
  int64_t bytes = static_cast<int64_t>(slot_bytes_) * slots_;  // gradient staging
  for (const absl::Span<std::byte>& h : host_) bytes += static_cast<int64_t>(h.size());
  if (pull_buffer_ != nullptr) {
    int64_t largest = 0;
    for (const FileBatch& b : file_batches_) {
      largest = std::max(largest, file_->RangeBytes(b.first, b.last));
    }
    bytes += largest;
  }
  bytes += static_cast<int64_t>(smallest_bytes_.size());
  for (const ReadSlot& slot : read_slots_) bytes += slot.bytes;
  return bytes;
}

OffloadLink::StreamedWeights OffloadLink::streamed_weights() const {
  if (file_options_.has_value()) return StreamedWeights::kFile;
  const std::vector<std::string> routes = client_->routes();
  const bool near =
      std::all_of(routes.begin(), routes.end(), [](const std::string& r) { return r != "grpc"; });
  return near ? StreamedWeights::kServers : StreamedWeights::kHostCopy;
}

absl::Status OffloadLink::PrepareFile() {
  const WeightFileOptions& o = *file_options_;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < params_.size(); ++i) {
    param_index_[params_[i]] = i;
    sizes.push_back(params_[i]->numel() * static_cast<int64_t>(DTypeSize(dtype_)));
  }
  const int64_t elem = static_cast<int64_t>(DTypeSize(dtype_));
  for (const model::Param* p : params_) {
    ZO_RETURN_IF_ERROR(CheckWeightBuffer(o.buffer_elems, p->name, p->numel()));
  }
  ZO_ASSIGN_OR_RETURN(file_, WeightFile::Create({.dir = o.dir, .io = o.io, .param_bytes = sizes}));
  // The buffer holds buffer_elems parameters, or one parameter rounded up
  // to the file's alignment.
  const int64_t buffer_bytes = std::max(o.buffer_elems * elem, int64_t{1});
  int64_t largest = 0;
  for (size_t first = 0; first < params_.size();) {
    size_t last = first + 1;
    while (last < params_.size() && file_->RangeBytes(first, last + 1) <= buffer_bytes) ++last;
    FileBatch batch;
    batch.first = first;
    batch.last = last;
    for (size_t i = first; i < last; ++i) batch.tensors.push_back(pulled_tensors_[i]);
    file_batches_.push_back(std::move(batch));
    largest = std::max(largest, file_->RangeBytes(first, last));
    first = last;
  }
  pull_arena_ = backend_.AllocateHost(static_cast<size_t>(largest + WeightFile::kAlignment - 1));
  pull_buffer_ = AlignUp(pull_arena_.get(), WeightFile::kAlignment);
  for (FileBatch& b : file_batches_) {
    for (size_t i = b.first; i < b.last; ++i) {
      b.dst.emplace_back(pull_buffer_ + (file_->offset(i) - file_->offset(b.first)),
                         static_cast<size_t>(file_->bytes(i)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<size_t>> OffloadLink::IndicesOf(
    absl::Span<const model::Param* const> params) const {
  std::vector<size_t> index;
  for (const model::Param* p : params) {
    auto it = param_index_.find(p);
    if (it == param_index_.end()) {
      return absl::InternalError(absl::StrCat(p->name, " is not among the stage's params"));
    }
    index.push_back(it->second);
  }
  return index;
}

absl::StatusOr<std::byte*> OffloadLink::Slot(int slot, int64_t bytes) {
  if (slot < 0 || slot > 1) return absl::InternalError(absl::StrCat("no read slot ", slot));
  ReadSlot& s = read_slots_[slot];
  if (bytes > s.bytes) {
    // Only the window's own thread for this slot is here (the window never
    // has two reads of one slot in flight).
    s.arena = backend_.AllocateHost(static_cast<size_t>(bytes + WeightFile::kAlignment - 1));
    s.data = AlignUp(s.arena.get(), WeightFile::kAlignment);
    s.bytes = bytes;
  }
  return s.data;
}

absl::StatusOr<std::vector<absl::Span<const std::byte>>> OffloadLink::ReadFromFile(
    absl::Span<const model::Param* const> params, int slot) {
  ZO_ASSIGN_OR_RETURN(const std::vector<size_t> index, IndicesOf(params));
  // Runs of consecutive params, each one read; a layer's params are one run.
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i : index) {
    if (!runs.empty() && runs.back().second == i) {
      ++runs.back().second;
    } else {
      runs.emplace_back(i, i + 1);
    }
  }
  int64_t need = 0;
  for (const auto& [first, last] : runs) need += file_->RangeBytes(first, last);
  ZO_ASSIGN_OR_RETURN(std::byte* const data, Slot(slot, need));
  std::map<size_t, const std::byte*> at;
  int64_t pos = 0;
  for (const auto& [first, last] : runs) {
    ZO_RETURN_IF_ERROR(file_->Read(first, last, data + pos));
    for (size_t i = first; i < last; ++i) {
      at[i] = data + pos + (file_->offset(i) - file_->offset(first));
    }
    pos += file_->RangeBytes(first, last);
  }
  std::vector<absl::Span<const std::byte>> out;
  for (size_t i : index) out.emplace_back(at[i], static_cast<size_t>(file_->bytes(i)));
  return out;
}

absl::StatusOr<std::vector<absl::Span<const std::byte>>> OffloadLink::ReadFromServers(
    OffloadClient* client, int64_t version, absl::Span<const model::Param* const> params,
    int slot) {
  ZO_ASSIGN_OR_RETURN(const std::vector<size_t> index, IndicesOf(params));
  int64_t need = 0;
  for (size_t i : index) need += params_[i]->numel() * static_cast<int64_t>(DTypeSize(dtype_));
  ZO_ASSIGN_OR_RETURN(std::byte* const data, Slot(slot, need));
  std::vector<int> tensors;
  std::vector<absl::Span<std::byte>> dst;
  int64_t pos = 0;
  for (size_t i : index) {
    const auto bytes = static_cast<size_t>(params_[i]->numel()) * DTypeSize(dtype_);
    if (bytes == 0) continue;  // a pull takes no empty tensor
    tensors.push_back(pulled_tensors_[i]);
    dst.emplace_back(data + pos, bytes);
    pos += static_cast<int64_t>(bytes);
  }
  if (!tensors.empty()) {
    // Cancellable like the step's first pull.
    PullCancellation cancel;
    if (abort_ != nullptr) abort_->Register(&cancel);
    absl::StatusOr<bool> pulled = client->Pull(version, -1, tensors, dst, &cancel);
    if (abort_ != nullptr) {
      abort_->Unregister(&cancel);
      if (!pulled.ok() && !abort_->reason().ok()) return abort_->reason();
    }
    ZO_RETURN_IF_ERROR(pulled.status());
  }
  std::vector<absl::Span<const std::byte>> out;
  pos = 0;
  for (size_t i : index) {
    const auto bytes = static_cast<size_t>(params_[i]->numel()) * DTypeSize(dtype_);
    out.emplace_back(data + pos, bytes);
    pos += static_cast<int64_t>(bytes);
  }
  return out;
}

namespace {

// host[i] -> dst[i] for every i, each after the work queued before it; waits
// for all of them and returns the first error.
absl::Status UploadAll(backend::Backend& backend, absl::Span<const absl::Span<std::byte>> host,
                       absl::Span<backend::Tensor* const> dst) {
  std::mutex mu;
  std::condition_variable done;
  size_t left = dst.size();
  absl::Status first;
  for (size_t i = 0; i < dst.size(); ++i) {
    backend.UploadAsync(host[i], *dst[i], [&](absl::Status s) {
      std::lock_guard<std::mutex> lock(mu);
      if (!s.ok() && first.ok()) first = s;
      if (--left == 0) done.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  done.wait(lock, [&] { return left == 0; });
  return first;
}

}  // namespace

absl::StatusOr<bool> OffloadLink::PullNow(int64_t step) {
  // Cancellable like a prefetch: a neighbour that dies leaves this pull
  // waiting for a version the servers cannot reach without it. (Stage 0
  // of 1F1B pushes last, so its next step's weights are mostly pulled here.)
  PullCancellation cancel;
  if (abort_ != nullptr) abort_->Register(&cancel);
  absl::StatusOr<bool> pulled;
  if (from_servers_) {
    // The version, its loss scale and whether it changed, for the price of
    // the smallest tensor; the window pulls the rest layer by layer.
    if (smallest_ < 0) {
      pulled = false;  // only empty tensors: nothing to pull, ever
    } else {
      const std::vector<int> tensor = {pulled_tensors_[smallest_]};
      const std::vector<absl::Span<std::byte>> dst = {absl::MakeSpan(smallest_bytes_)};
      pulled = client_->PullForStep(step, tensor, dst, &loss_scale_, &cancel);
    }
  } else if (file_ == nullptr) {
    pulled = client_->PullForStep(step, pulled_tensors_, host_, &loss_scale_, &cancel);
  } else {
    std::vector<OffloadClient::PullBatch> batches;
    for (const FileBatch& b : file_batches_) batches.push_back({b.tensors, b.dst});
    pulled = client_->PullForStepInBatches(
        step, batches,
        [&](size_t b) {
          return file_->Write(file_batches_[b].first, file_batches_[b].last, pull_buffer_);
        },
        &loss_scale_, &cancel);
  }
  if (abort_ != nullptr) {
    abort_->Unregister(&cancel);
    if (!pulled.ok() && !abort_->reason().ok()) return abort_->reason();
  }
  return pulled;
}

absl::StatusOr<model::HostWeights> OffloadLink::LoadHostWeights(
    int64_t step, absl::Span<model::Param* const> params) {
  ZO_RETURN_IF_ERROR(Prepare(params, /*streaming=*/true));
  // A pull that leaves the version unchanged leaves host_ as it was: the
  // weights the step before computed on, which are this step's. (After a
  // failed pull or a restore the client pulls whole and says changed.)
  ZO_ASSIGN_OR_RETURN(const bool changed, PullNow(step));
  model::HostWeights weights;
  weights.changed = changed;
  if (from_servers_) {
    weights.read = [this, client = client_, version = client_->last_pulled_version()](
                       absl::Span<const model::Param* const> params, int slot) {
      return ReadFromServers(client, version, params, slot);
    };
  } else if (file_ != nullptr) {
    weights.read = [this](absl::Span<const model::Param* const> params, int slot) {
      return ReadFromFile(params, slot);
    };
  } else {
    weights.bytes.assign(host_.begin(), host_.end());
  }
  return weights;
}

absl::Status OffloadLink::LoadNow(int64_t step) {
  ZO_ASSIGN_OR_RETURN(const bool changed, PullNow(step));
  // Where DPU starts (two steps on one version) and after a skipped step
  // the weights stay: no copy to the device.
  if (changed || host_ahead_) {
    std::vector<backend::Tensor*> values;
    for (model::Param* p : params_) values.push_back(&p->value);
    ZO_RETURN_IF_ERROR(UploadAll(backend_, host_, values));
  }
  host_ahead_ = false;
  return absl::OkStatus();
}

void OffloadLink::MaybePrefetch(int64_t step) {
  if (prefetch_step_ >= 0 || params_.empty() || streaming_) return;
  if (VersionForStep(client_->config().zo.dpu, step) > pushed_) return;
  prefetch_step_ = step;
  prefetch_cancel_ = std::make_unique<PullCancellation>();
  if (abort_ != nullptr) abort_->Register(prefetch_cancel_.get());
  prefetch_ = std::thread([this, client = client_, step, cancel = prefetch_cancel_.get()] {
    absl::StatusOr<bool> changed =
        client->PullForStep(step, pulled_tensors_, host_, &prefetch_loss_scale_, cancel);
    prefetch_changed_ = changed.ok() && *changed;
    if (!changed.ok()) {
      prefetch_status_ = changed.status();
      return;
    }
    std::vector<backend::Tensor*> idle;
    for (backend::Tensor& t : idle_) idle.push_back(&t);
    prefetch_status_ = prefetch_changed_ ? UploadAll(backend_, host_, idle) : absl::OkStatus();
  });
}

void OffloadLink::JoinPrefetch() {
  if (prefetch_.joinable()) prefetch_.join();
  if (abort_ != nullptr && prefetch_cancel_ != nullptr) abort_->Unregister(prefetch_cancel_.get());
}

void OffloadLink::CancelPrefetch() {
  if (prefetch_cancel_ != nullptr) prefetch_cancel_->Cancel();
  JoinPrefetch();
}

absl::Status OffloadLink::LoadWeights(int64_t step, absl::Span<model::Param* const> params) {
  ZO_RETURN_IF_ERROR(Prepare(params, /*streaming=*/false));
  const int64_t prefetched = std::exchange(prefetch_step_, -1);
  if (prefetched == step) {
    JoinPrefetch();
    if (!prefetch_status_.ok()) {
      host_ahead_ = true;  // a retry uploads whatever the failed prefetch left
      if (abort_ != nullptr && !abort_->reason().ok()) return abort_->reason();
      return prefetch_status_;
    }
    if (prefetch_changed_) {
      for (size_t i = 0; i < params_.size(); ++i) std::swap(params_[i]->value, idle_[i]);
    }
    loss_scale_ = prefetch_loss_scale_;
  } else {
    // A prefetch for another step (a step retried): its version may never
    // come before this step is done, and what it left in host_ is not on the
    // device.
    CancelPrefetch();
    if (prefetched >= 0) host_ahead_ = true;
    ZO_RETURN_IF_ERROR(LoadNow(step));
  }
  MaybePrefetch(step + 1);
  return absl::OkStatus();
}

double OffloadLink::LossScale(int64_t) { return loss_scale_; }

absl::Status OffloadLink::PushGradient(int64_t step, const model::Param& param, int micro_batch) {
  ZO_ASSIGN_OR_RETURN(int index, TensorIndex(param.name));
  auto place = places_.find(index);
  if (place == places_.end()) {
    return absl::InternalError(
        absl::StrCat("gradient '", param.name, "' pushed before its stage's first LoadWeights"));
  }
  const int slot = micro_batch < 0 ? 0 : micro_batch % slots_;
  const size_t busy_at = static_cast<size_t>(slot) * params_.size() + place->second.first;
  {
    // The place's previous bytes (micro-batch m - 2, or the step before)
    // must be on the wire before they are overwritten.
    std::unique_lock<std::mutex> lock(staging_->mu);
    staging_->freed.wait(lock, [&] { return !staging_->busy[busy_at]; });
    staging_->busy[busy_at] = 1;
  }
  // fp32 -> fp16 turns an overflowing gradient into inf: that is how the
  // servers see the overflow and skip the step.
  backend::Tensor low = backend_.Cast(param.grad, dtype_);
  const size_t bytes = static_cast<size_t>(low.nbytes());
  const absl::Span<std::byte> dst(
      staging_->arena.get() + static_cast<size_t>(slot) * slot_bytes_ + place->second.second,
      bytes);
  // Frees the place once the last holder (the client, or this link when the
  // copy or push fails) lets go; keeps the arena alive until then.
  std::shared_ptr<const void> owner(dst.data(), [staging = staging_, busy_at](const void*) {
    std::lock_guard<std::mutex> lock(staging->mu);
    staging->busy[busy_at] = 0;
    staging->freed.notify_all();
  });
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!copy_error_.ok()) return copy_error_;
    ++copies_in_flight_;
  }
  OffloadClient* client = client_;
  const int pushed_micro_batch = std::max(micro_batch, 0);
  backend_.DownloadAsync(low, dst,
                         [this, client, step, index, owner = std::move(owner), dst,
                          pushed_micro_batch](absl::Status s) mutable {
                           if (s.ok())
                             s = client->PushShared(step, index, std::move(owner), dst,
                                                    pushed_micro_batch);
                           owner.reset();
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
  ZO_RETURN_IF_ERROR(client_->FinishStep(step));
  pushed_ = std::max(pushed_, step);
  MaybePrefetch(step + 1);
  return absl::OkStatus();
}

}  // namespace zo::train
