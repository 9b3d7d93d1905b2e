#include "worker/train/offload_link.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dpu_policy.h"
#include "common/logging.h"
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
  // Weights pulled into the old client's region go with it; the new client
  // pulls its first version whole.
  if (host_arena_ == nullptr && !host_.empty()) PlaceHostWeights();
}

void OffloadLink::PlaceHostWeights() {
  // On the same-host route the weights are pulled where the server writes
  // them, in its shared region, when the backend uploads from there at full
  // speed (not CUDA's copy engine: that wants page-locked memory).
  host_.clear();
  host_arena_.reset();
  if (backend_.UploadsFromAnyHostMemory()) host_ = client_->RegionPullBuffers(pulled_tensors_);
  if (!host_.empty()) {
    ZO_LOG(INFO) << "weights are pulled where the server writes them (its shared-memory region)";
    return;
  }
  size_t total = 0;
  for (model::Param* p : params_) total += static_cast<size_t>(p->numel()) * DTypeSize(dtype_);
  host_arena_ = backend_.AllocateHost(total);
  size_t offset = 0;
  for (model::Param* p : params_) {
    const size_t bytes = static_cast<size_t>(p->numel()) * DTypeSize(dtype_);
    host_.emplace_back(host_arena_.get() + offset, bytes);
    offset += bytes;
  }
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
  const size_t gradient_bytes = bytes_16;
  params_.assign(params.begin(), params.end());
  if (streaming_) {
    StreamedWeights::Stage stage{
        .backend = &backend_,
        .dtype = dtype_,
        .params = params_,
        .tensors = pulled_tensors_,
        .guard = [this](const std::function<absl::StatusOr<bool>(PullCancellation*)>& pull) {
          return Guarded(pull);
        }};
    ZO_ASSIGN_OR_RETURN(streamed_,
                        StreamedWeights::Create(streamed_kind(), std::move(stage),
                                                file_options_.value_or(WeightFileOptions{})));
  } else {
    PlaceHostWeights();
    for (model::Param* p : params_) {
      idle_.push_back(backend_.Empty(dtype_, p->shape));
      if (compensate_) {
        served_.push_back(backend_.Empty(dtype_, p->shape));
        served_before_.push_back(backend_.Empty(dtype_, p->shape));
      }
    }
  }
  slots_ = PushesPerRank(client_->config()) > 1 ? 2 : 1;
  slot_bytes_ = gradient_bytes;
  size_t at = 0;
  size_t largest = 0;    // in the ring
  size_t footprint = 0;  // all of a slot, in the ring
  for (size_t i = 0; i < params_.size(); ++i) {
    const size_t bytes = static_cast<size_t>(params_[i]->numel()) * DTypeSize(dtype_);
    places_[pulled_tensors_[i]] = {static_cast<int>(i), at};
    at += bytes;
    largest = std::max(largest, StagingRing::Footprint(bytes));
    footprint += StagingRing::Footprint(bytes);
  }
  if (streaming_) {
    // Its gradients leave as the backward makes them: a ring of a few
    // layers' worth rather than a place per parameter (a copy of the stage).
    const size_t ring =
        std::min(footprint * static_cast<size_t>(slots_),
                 std::max(static_cast<size_t>(kStreamingGradientRingBytes), 2 * largest));
    ring_ = StagingRing::Create(backend_.AllocateHost(ring), ring);
  } else {
    staging_ = std::make_shared<Staging>();
    staging_->arena = backend_.AllocateHost(gradient_bytes * static_cast<size_t>(slots_));
    staging_->busy.assign(params_.size() * static_cast<size_t>(slots_), 0);
  }
  // Versions up to the job's are there to pull.
  pushed_ = client_->version();
  return absl::OkStatus();
}

int64_t OffloadLink::host_bytes() const {
  int64_t bytes = ring_ != nullptr ? static_cast<int64_t>(ring_->capacity())
                                   : static_cast<int64_t>(slot_bytes_) * slots_;  // gradients
  for (const absl::Span<std::byte>& h : host_) bytes += static_cast<int64_t>(h.size());
  if (streamed_ != nullptr) bytes += streamed_->host_bytes();
  return bytes;
}

StreamedWeights::Kind OffloadLink::streamed_kind() const {
  return StreamedWeights::KindFor(client_->routes(), file_options_.has_value());
}

absl::StatusOr<bool> OffloadLink::Guarded(
    const std::function<absl::StatusOr<bool>(PullCancellation*)>& pull) {
  PullCancellation cancel;
  if (abort_ != nullptr) abort_->Register(&cancel);
  absl::StatusOr<bool> pulled = pull(&cancel);
  if (abort_ != nullptr) {
    abort_->Unregister(&cancel);
    if (!pulled.ok() && !abort_->reason().ok()) return abort_->reason();
  }
  return pulled;
}

namespace {

absl::Status UploadHost(backend::Backend& backend, absl::Span<const absl::Span<std::byte>> host,
                        absl::Span<backend::Tensor* const> dst) {
  const std::vector<absl::Span<const std::byte>> bytes(host.begin(), host.end());
  return backend::UploadAll(backend, bytes, dst);
}

}  // namespace

absl::StatusOr<bool> OffloadLink::PullNow(int64_t step) {
  // Cancellable like a prefetch. (Stage 0 of 1F1B pushes last, so its next
  // step's weights are mostly pulled here.)
  return Guarded([&](PullCancellation* cancel) {
    return client_->PullForStep(step, pulled_tensors_, host_, &loss_scale_, cancel);
  });
}

absl::StatusOr<model::HostWeights> OffloadLink::LoadHostWeights(
    int64_t step, absl::Span<model::Param* const> params) {
  ZO_RETURN_IF_ERROR(Prepare(params, /*streaming=*/true));
  ZO_ASSIGN_OR_RETURN(const bool changed, streamed_->Pull(*client_, step, &loss_scale_));
  return streamed_->Weights(changed);
}

absl::StatusOr<bool> OffloadLink::LoadNow(int64_t step) {
  ZO_ASSIGN_OR_RETURN(const bool changed, PullNow(step));
  // Where DPU starts (two steps on one version) and after a skipped step
  // the weights stay: no copy to the device.
  const bool upload = changed || host_ahead_;
  if (upload) {
    std::vector<backend::Tensor*> values;
    for (model::Param* p : params_) values.push_back(&p->value);
    ZO_RETURN_IF_ERROR(UploadHost(backend_, host_, values));
  }
  host_ahead_ = false;
  return upload;
}

absl::Status OffloadLink::Compensate(int64_t step, bool fresh) {
  const DpuConfig& dpu = client_->config().zo.dpu;
  const int64_t version = VersionForStep(dpu, step);
  const backend::Tensor none;
  if (fresh) {
    // Keep the version as pulled (the next steps' weights start from it) by
    // taking the params' tensors, not copying them: the params are written
    // below either way.
    std::swap(served_, served_before_);
    served_before_version_ = served_version_;
    for (size_t i = 0; i < params_.size(); ++i) std::swap(params_[i]->value, served_[i]);
    params_moved_ = true;
  } else if (served_version_ < 0) {
    return absl::InternalError("DPU compensation: no version pulled before the first step");
  }
  // Unchanged: the weights of `version` are those kept.
  served_version_ = version;
  const bool delayed = version == step - 2 && step >= 2;
  if (!delayed) {
    if (params_moved_) {
      for (size_t i = 0; i < params_.size(); ++i) {
        backend_.CombineWeights(served_[i], none, none, 1, 0, 0, params_[i]->value);
      }
      params_moved_ = false;
    }
    return absl::OkStatus();
  }
  const bool have_before = served_before_version_ == version - 1;
  ZO_ASSIGN_OR_RETURN(const std::vector<WeightsCompensation> c,
                      client_->StepCompensation(step - 1, have_before));
  for (size_t i = 0; i < params_.size(); ++i) {
    const WeightsCompensation& w = c[static_cast<size_t>(pulled_tensors_[i])];
    const backend::Tensor& grad = params_[i]->grad;
    if (w.grad != 0 && !grad.defined()) {
      return absl::InternalError(absl::StrCat("DPU compensation: parameter '", params_[i]->name,
                                              "' kept no gradient of step ", step - 1));
    }
    // A zero coefficient leaves its term out: a skipped step's gradient
    // may be inf.
    backend_.CombineWeights(served_[i], w.before != 0 ? served_before_[i] : none,
                            w.grad != 0 ? grad : none, static_cast<float>(w.last),
                            static_cast<float>(w.before), static_cast<float>(w.grad),
                            params_[i]->value);
  }
  params_moved_ = true;
  return absl::OkStatus();
}

void OffloadLink::MaybePrefetch(int64_t step) {
  // While the step's own uploads arrive, host_ and the thread are theirs.
  if (prefetch_step_ >= 0 || arriving_ || params_.empty() || streaming_) return;
  if (VersionForStep(client_->config().zo.dpu, step) > pushed_.load() + 1) return;
  JoinPrefetch();
  prefetch_step_ = step;
  prefetch_cancel_ = std::make_unique<PullCancellation>();
  if (abort_ != nullptr) abort_->Register(prefetch_cancel_.get());
  arrivals_ = std::make_shared<Arrivals>();
  arrivals_->targets = idle_;  // the handles: LoadWeights may swap idle_ meanwhile
  prefetch_ =
      std::thread([this, client = client_, step, cancel = prefetch_cancel_.get(), a = arrivals_] {
        const int64_t version = VersionForStep(client->config().zo.dpu, step);
        const std::vector<size_t> ends = PullBatchEnds(*client);
        std::vector<OffloadClient::PullBatch> batches;
        for (size_t b = 0, begin = 0; b < ends.size(); begin = ends[b++]) {
          batches.push_back(
              {.tensors = absl::MakeConstSpan(pulled_tensors_).subspan(begin, ends[b] - begin),
               .dst = absl::MakeConstSpan(host_).subspan(begin, ends[b] - begin)});
        }
        // Batches arrive in any order; their uploads are queued in layer order
        // (a device copies the first layers first), each batch once those
        // before it are there.
        std::mutex order_mu;
        std::shared_ptr<const void> mark;         // guarded by order_mu
        bool decided = false;                     // guarded by order_mu; a->pulled is set
        std::vector<char> there(ends.size(), 0);  // guarded by order_mu
        size_t queued = 0;                        // batches queued; guarded by order_mu
        double loss_scale = 1;
        // On the in-process route the servers answer a batch once they have
        // written it, so the first layers compute while the last are still
        // being updated.
        const auto arrived = [&](size_t b) -> absl::Status {
          std::lock_guard<std::mutex> order(order_mu);
          if (!decided) {
            // Before the step these weights are for can queue any compute:
            // the uploads wait for the work queued up to here (the step
            // before, whose weights these tensors held), not for the first
            // layers of their own step.
            mark = backend_.QueuedWorkMark();
            prefetch_changed_ = true;
            prefetch_status_ = absl::OkStatus();
            prefetch_loss_scale_ = loss_scale;
            decided = true;
            {
              std::lock_guard<std::mutex> lock(a->mu);
              a->pulled = true;
              a->done.assign(a->targets.size(), 0);
            }
            a->changed.notify_all();
          }
          there[b] = 1;
          for (; queued < ends.size() && there[queued]; ++queued) {
            const size_t begin = queued == 0 ? 0 : ends[queued - 1];
            {
              std::lock_guard<std::mutex> lock(a->mu);
              a->uploads = ends[queued];
            }
            for (size_t i = begin; i < ends[queued]; ++i) {
              backend_.UploadAsyncAfter(host_[i], a->targets[i], mark, [a, i](absl::Status s) {
                {
                  std::lock_guard<std::mutex> lock(a->mu);
                  a->done[i] = s.ok() ? 1 : 0;  // a failed one is never ready
                  if (!s.ok() && a->error.ok()) a->error = std::move(s);
                  ++a->finished;
                  while (a->ready < a->done.size() && a->done[a->ready]) ++a->ready;
                }
                a->changed.notify_all();
              });
            }
          }
          return absl::OkStatus();
        };
        absl::StatusOr<bool> changed;
        bool any = false;
        do {
          changed = client->PullForStepAsWritten(
              step, batches, arrived,
              [a] {
                {
                  std::lock_guard<std::mutex> lock(a->mu);
                  a->registered = true;
                }
                a->changed.notify_all();
              },
              &loss_scale, cancel);
          std::lock_guard<std::mutex> order(order_mu);
          any = decided;
          // A pull that outwaits the client's call timeout while this worker's
          // own step, whose pushes make the version, still runs (a long step,
          // not a stuck server) waits again, unless part of it came.
        } while (!any && absl::IsDeadlineExceeded(changed.status()) && !cancel->cancelled() &&
                 pushed_.load() < version);
        if (any) {
          // The step may be computing on the first batches: one that failed
          // fails the layers that await it.
          if (!changed.ok()) {
            {
              std::lock_guard<std::mutex> lock(a->mu);
              if (a->error.ok()) a->error = changed.status();
            }
            a->changed.notify_all();
          }
          return;
        }
        prefetch_changed_ = false;
        prefetch_status_ = changed.status();
        prefetch_loss_scale_ = loss_scale;
        {
          std::lock_guard<std::mutex> lock(a->mu);
          a->pulled = true;
        }
        a->changed.notify_all();
      });
  // Its pulls are registered before the step goes on: the servers' update
  // of the version, a speculative one during this step's backward, then
  // writes into them as it goes (one registered after its chunk was
  // speculated waits for the version's commit).
  std::unique_lock<std::mutex> lock(arrivals_->mu);
  arrivals_->changed.wait(lock, [a = arrivals_.get()] { return a->registered; });
}

std::vector<size_t> OffloadLink::PullBatchEnds(OffloadClient& client) const {
  // Only the in-process route answers a pull of some tensors before the
  // version is whole; elsewhere batches would only add round trips.
  const std::vector<std::string> routes = client.routes();
  const bool early = std::all_of(routes.begin(), routes.end(),
                                 [](const std::string& r) { return r == "in_process"; });
  if (!early || params_.size() < 2) return {params_.size()};
  // Batches of about a kPullBatches-th of the stage's bytes each: fewer
  // calls than one per tensor, and the first layers still come early.
  size_t total = 0;
  for (const absl::Span<std::byte>& h : host_) total += h.size();
  const size_t target = std::max<size_t>(1, total / kPullBatches);
  std::vector<size_t> ends;
  size_t bytes = 0;
  for (size_t i = 0; i < host_.size(); ++i) {
    bytes += host_[i].size();
    if (bytes >= target) {
      ends.push_back(i + 1);
      bytes = 0;
    }
  }
  // What is left after the last full batch joins it.
  if (ends.empty()) ends.push_back(host_.size());
  ends.back() = host_.size();
  return ends;
}

void OffloadLink::JoinPrefetch() {
  if (prefetch_.joinable()) prefetch_.join();
  if (abort_ != nullptr && prefetch_cancel_ != nullptr) abort_->Unregister(prefetch_cancel_.get());
  if (arrivals_ != nullptr) {
    // The thread ended, so the uploads are all queued; a device may still
    // be copying host_ into the tensors.
    std::unique_lock<std::mutex> lock(arrivals_->mu);
    arrivals_->changed.wait(lock, [a = arrivals_.get()] { return a->finished == a->uploads; });
  }
}

void OffloadLink::CancelPrefetch() {
  if (prefetch_cancel_ != nullptr) prefetch_cancel_->Cancel();
  JoinPrefetch();
}

void OffloadLink::DropArrivals() {
  JoinPrefetch();
  arriving_ = false;
  host_ahead_ = true;  // the params may hold part of an upload: the next load redoes it whole
}

absl::Status OffloadLink::WaitArrivals(size_t end) {
  Arrivals& a = *arrivals_;
  std::unique_lock<std::mutex> lock(a.mu);
  a.changed.wait(lock, [&] { return a.ready >= end || !a.error.ok(); });
  return a.ready >= end ? absl::OkStatus() : a.error;
}

absl::Status OffloadLink::AwaitWeights(absl::Span<model::Param* const> first) {
  if (!arriving_) return absl::OkStatus();
  if (absl::Status there = WaitArrivals(std::min(first.size(), params_.size())); !there.ok()) {
    DropArrivals();
    return there;
  }
  {
    std::lock_guard<std::mutex> lock(arrivals_->mu);
    if (arrivals_->ready < params_.size()) return absl::OkStatus();
  }
  // All there: the thread and host_ are free for the next step's prefetch.
  arriving_ = false;
  JoinPrefetch();
  MaybePrefetch(loaded_step_ + 1);
  return absl::OkStatus();
}

absl::Status OffloadLink::LoadWeights(int64_t step, absl::Span<model::Param* const> params) {
  ZO_RETURN_IF_ERROR(Prepare(params, /*streaming=*/false));
  // The step before failed before all of its weights were there.
  if (arriving_) DropArrivals();
  loaded_step_ = step;
  const int64_t prefetched = std::exchange(prefetch_step_, -1);
  if (prefetched == step) {
    {
      std::unique_lock<std::mutex> lock(arrivals_->mu);
      arrivals_->changed.wait(lock, [a = arrivals_.get()] { return a->pulled; });
    }
    if (!prefetch_status_.ok()) {
      JoinPrefetch();
      host_ahead_ = true;  // a retry uploads whatever the failed prefetch left
      if (abort_ != nullptr && !abort_->reason().ok()) return abort_->reason();
      return prefetch_status_;
    }
    // Read before AwaitWeights, which may start the next step's prefetch,
    // whose thread writes prefetch_* again (a compensated step once took
    // the next prefetch's "unchanged" for its own and computed on the
    // version before).
    const bool changed = prefetch_changed_;
    if (changed) {
      // The tensors the uploads go on writing into, in layer order.
      for (size_t i = 0; i < params_.size(); ++i) std::swap(params_[i]->value, idle_[i]);
      arriving_ = true;
    } else {
      JoinPrefetch();
    }
    loss_scale_ = prefetch_loss_scale_;
    if (compensate_) {
      ZO_RETURN_IF_ERROR(AwaitWeights(params_));  // it combines whole versions
      ZO_RETURN_IF_ERROR(Compensate(step, changed));
    }
  } else {
    // A prefetch for another step (a step retried): its version may never
    // come before this step is done, and what it left in host_ is not on the
    // device.
    CancelPrefetch();
    if (prefetched >= 0) host_ahead_ = true;
    ZO_ASSIGN_OR_RETURN(const bool fresh, LoadNow(step));
    if (compensate_) ZO_RETURN_IF_ERROR(Compensate(step, fresh));
  }
  MaybePrefetch(step + 1);  // while arriving, AwaitWeights starts it once they are there
  return absl::OkStatus();
}

double OffloadLink::LossScale(int64_t) { return loss_scale_; }

bool OffloadLink::MayLendGradientPlaces() {
  // Asked once per client: only its in-process and same-host routes lend
  // places, and only a backend that downloads to any host memory uses them.
  if (lend_checked_for_ != client_) {
    lend_checked_for_ = client_;
    const std::vector<std::string> routes = client_->routes();
    may_lend_ = backend_.DownloadsToAnyHostMemory() &&
                std::any_of(routes.begin(), routes.end(), [](const std::string& r) {
                  return r == "in_process" || r == "shared_memory";
                });
  }
  return may_lend_;
}

absl::Status OffloadLink::PushGradient(int64_t step, const model::Param& param, int micro_batch) {
  ZO_ASSIGN_OR_RETURN(int index, TensorIndex(param.name));
  auto place = places_.find(index);
  if (place == places_.end()) {
    return absl::InternalError(
        absl::StrCat("gradient '", param.name, "' pushed before its stage's first LoadWeights"));
  }
  absl::Span<std::byte> dst;
  std::shared_ptr<const void> owner;
  // fp32 -> fp16 turns an overflowing gradient into inf: that is how the
  // servers see the overflow and skip the step.
  const size_t bytes = static_cast<size_t>(param.numel()) * DTypeSize(dtype_);
  if (ring_ == nullptr && MayLendGradientPlaces()) {
    // Where the server reads the gradient (the same-host route's shared
    // region, an embedded server's own buffer) it goes there rather than
    // through the staging arena: a copy less. On the same-host route the
    // client waits here for that place to be free.
    ZO_ASSIGN_OR_RETURN(const std::vector<absl::Span<std::byte>> lent,
                        client_->PushBuffers(step, std::vector<int>{index}));
    if (lent.size() == 1 && lent[0].size() == bytes && bytes > 0) {
      dst = lent[0];
      owner = std::shared_ptr<const void>(dst.data(), [](const void*) {});
      if (!said_gradients_in_place_) {
        said_gradients_in_place_ = true;
        ZO_LOG(INFO) << "gradients are written where the server reads them (routes: "
                     << absl::StrJoin(client_->routes(), ", ") << ")";
      }
    }
  }
  if (owner == nullptr && ring_ != nullptr) {
    // Waits while the ring is full: for the client to write out older ones.
    ZO_ASSIGN_OR_RETURN(StagingRing::Region region, ring_->Acquire(bytes));
    dst = absl::MakeSpan(region.data, bytes);
    owner = std::move(region.owner);
  } else if (owner == nullptr) {
    const int slot = micro_batch < 0 ? 0 : micro_batch % slots_;
    const size_t busy_at = static_cast<size_t>(slot) * params_.size() + place->second.first;
    {
      // The place's previous bytes (micro-batch m - 2, or the step before)
      // must be on the wire before they are overwritten.
      std::unique_lock<std::mutex> lock(staging_->mu);
      staging_->freed.wait(lock, [&] { return !staging_->busy[busy_at]; });
      staging_->busy[busy_at] = 1;
    }
    dst = absl::MakeSpan(
        staging_->arena.get() + static_cast<size_t>(slot) * slot_bytes_ + place->second.second,
        bytes);
    // Frees the place once the last holder (the client, or this link when
    // the copy or push fails) lets go; keeps the arena alive until then.
    owner = std::shared_ptr<const void>(dst.data(), [staging = staging_, busy_at](const void*) {
      std::lock_guard<std::mutex> lock(staging->mu);
      staging->busy[busy_at] = 0;
      staging->freed.notify_all();
    });
  }
  backend::Tensor low = backend_.Cast(param.grad, dtype_);
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
  // Every layer computed, so this only ends the step's arrivals.
  ZO_RETURN_IF_ERROR(AwaitWeights(params_));
  {
    std::unique_lock<std::mutex> lock(mu_);
    copied_.wait(lock, [this] { return copies_in_flight_ == 0; });
    if (!copy_error_.ok()) return std::exchange(copy_error_, absl::OkStatus());
  }
  ZO_RETURN_IF_ERROR(client_->FinishStep(step));
  pushed_ = std::max(pushed_.load(), step);
  MaybePrefetch(step + 1);
  return absl::OkStatus();
}

}  // namespace zo::train
