// OffloadClient's pulls of weights, over any route, and their cancellation.
#include <algorithm>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/dpu_policy.h"
#include "common/status_context.h"
#include "common/status_macros.h"
#include "rpc/error_detail.h"
#include "rpc/in_process_route.h"
#include "worker/client/internal/call.h"
#include "worker/client/internal/offload_client_impl.h"
#include "worker/client/internal/pull_receiver.h"
#include "worker/client/offload_client.h"

namespace zo {
namespace {

using client_internal::CallGroup;
using client_internal::OnceAllArrived;
using client_internal::PullReceiver;
using client_internal::RetryCall;
using client_internal::RunInParallel;

}  // namespace

absl::Status OffloadClient::Impl::PullFrom(int server, int stripe, int stripes, int64_t version,
                                           int64_t have_version, PullReceiver& receiver,
                                           CallGroup& group,
                                           const std::function<void()>& registered) {
  v1::PullParamsRequest request;
  request.set_job(options.job);
  request.set_version(version);
  request.set_have_version(have_version);
  request.set_incarnation(incarnation[server].load(std::memory_order_relaxed));
  for (int t : receiver.tensors()) request.add_tensors(t);
  if (stripes > 1) {
    request.set_stripe(stripe);
    request.set_stripes(stripes);
  }
  if (routes[server] != nullptr) return PullLocal(server, request, receiver, group, registered);
  if (registered) registered();  // nothing to register: the call begins
  // Once RegionPullBuffers lent the weights area's bytes, a pull into other
  // buffers takes gRPC: the region would change what the lent ones hold.
  uint64_t region = RegionId(server);
  if (region != 0 && region_lent[server] && !PullsIntoRegionPlaces(receiver)) region = 0;
  std::unique_lock<std::mutex> region_lock;
  if (region != 0) {
    // Into the weights area, which one pull at a time may use.
    request.set_region(region);
    request.set_region_offset(regions[server]->WeightsAreaOffset());
    request.set_batched_ranges(true);  // PullReceiver::AcceptFromRegion reads them
    region_lock = std::unique_lock(region_pull_mu[server]);
  }
  absl::Status pulled = RetryCall(call, names[server], &group, [&](grpc::ClientContext& context) {
    receiver.Reset();
    std::unique_ptr<grpc::ClientReader<v1::ParamPiece>> reader =
        data_stubs[server][static_cast<size_t>(stripe)]->PullParams(&context, request);
    v1::ParamPiece piece;
    while (reader->Read(&piece)) {
      absl::Status s = region == 0
                           ? receiver.Accept(piece)
                           : receiver.AcceptFromRegion(piece, regions[server]->weights(),
                                                       regions[server]->WeightsAreaOffset());
      if (!s.ok()) {
        context.TryCancel();
        reader->Finish();
        return s;
      }
    }
    ZO_RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
    return receiver.Finish();
  });
  if (region != 0 && ReasonOf(pulled) == v1::ErrorDetail::UNKNOWN_REGION) {
    // The server lost this worker's region (it restarted): over gRPC.
    DropRegion(server, pulled);
    region_lock.unlock();
    return PullFrom(server, stripe, stripes, version, have_version, receiver, group, nullptr);
  }
  return pulled;
}

absl::Status OffloadClient::Impl::AwaitLocalVersion(int server,
                                                    const v1::PullParamsRequest& request,
                                                    absl::Time deadline, CallGroup& group) {
  InProcessRoute& route = *routes[server];
  // Woken by the server (the version came, or the job changed) or by the
  // group's cancellation; shared, as a wake may run after this returns.
  struct Waiter {
    std::mutex mu;
    std::condition_variable cv;
    bool woken = false;
    void Wake() {
      {
        std::lock_guard lock(mu);
        woken = true;
      }
      cv.notify_all();
    }
  };
  auto waiter = std::make_shared<Waiter>();
  for (;;) {
    {
      std::lock_guard lock(waiter->mu);
      waiter->woken = false;
    }
    uint64_t ticket = 0;
    ZO_ASSIGN_OR_RETURN(const bool has, route.AwaitVersion(
                                            request.job(), request.version(), request.incarnation(),
                                            [waiter] { waiter->Wake(); }, &ticket));
    if (has) return absl::OkStatus();
    const bool cancellable = group.AddHook(waiter.get(), [waiter] { waiter->Wake(); });
    bool woken = false;
    if (cancellable) {
      std::unique_lock lock(waiter->mu);
      woken =
          waiter->cv.wait_until(lock, absl::ToChronoTime(deadline), [&] { return waiter->woken; });
    }
    group.RemoveHook(waiter.get());
    if (group.cancelled()) {
      route.CancelVersionWait(request.job(), ticket);
      return absl::CancelledError(
          absl::StrCat("the pull of version ", request.version(), " was cancelled"));
    }
    if (!woken && route.CancelVersionWait(request.job(), ticket)) {
      return absl::DeadlineExceededError(absl::StrCat("version ", request.version(), " of job ",
                                                      request.job(), " did not exist within ",
                                                      absl::FormatDuration(call.attempt.timeout)));
    }
    // Woken: ask again.
  }
}

absl::Status OffloadClient::Impl::PullLocal(int server, const v1::PullParamsRequest& request,
                                            PullReceiver& receiver, CallGroup& group,
                                            const std::function<void()>& registered) {
  InProcessRoute& route = *routes[server];
  const auto place = [&](const InProcessRoute::PulledRange& r) {
    return receiver.Place(r.tensor, r.offset, r.elems);
  };
  bool said = false;
  return RetryCall(call, names[server], &group, [&](grpc::ClientContext&) -> absl::Status {
    receiver.Reset();
    // The next version's update writes the weights here itself when it can.
    absl::StatusOr<uint64_t> registration = route.RegisterPull(request, place);
    if (registered && !std::exchange(said, true)) registered();
    ZO_ASSIGN_OR_RETURN(const uint64_t fill, std::move(registration));
    if (fill == 0) receiver.Reset();  // it may have asked for places before saying no
    absl::Cleanup withdraw = [&] {
      if (fill != 0) route.WithdrawPull(fill);
    };
    ZO_RETURN_IF_ERROR(
        AwaitLocalVersion(server, request, absl::Now() + call.attempt.timeout, group));
    if (fill != 0) {
      std::move(withdraw).Cancel();
      ZO_ASSIGN_OR_RETURN(const std::optional<InProcessRoute::PullResult> filled,
                          route.TakeFilledPull(request, fill));
      if (filled.has_value()) {
        ZO_RETURN_IF_ERROR(receiver.SetLossScale(filled->loss_scale));
        return receiver.Finish();
      }
      receiver.Reset();  // not filled (a skipped step, a restore): read it
    }
    ZO_ASSIGN_OR_RETURN(const InProcessRoute::PullResult result, route.PullInto(request, place));
    ZO_RETURN_IF_ERROR(result.unchanged ? receiver.AcceptUnchanged(result.loss_scale)
                                        : receiver.SetLossScale(result.loss_scale));
    return receiver.Finish();
  });
}

absl::Status OffloadClient::Impl::WithStuckPeer(absl::Status error) {
  if (error.code() != absl::StatusCode::kDeadlineExceeded &&
      error.code() != absl::StatusCode::kUnavailable) {
    return error;
  }
  v1::GetJobStatusRequest request;
  request.set_job(options.job);
  absl::StatusOr<v1::JobStatus> lead = Unary<v1::JobStatus>(
      0, [&](v1::Offload::Stub& stub, grpc::ClientContext& context, v1::JobStatus& response) {
        return stub.GetJobStatus(&context, request, &response);
      });
  if (!lead.ok() || lead->waiting_on_peer().empty()) return error;
  return WithMessage(error, absl::StrCat(error.message(), "; the lead (", names[0],
                                         ") is stuck: ", lead->waiting_on_peer()));
}

absl::StatusOr<bool> OffloadClient::Impl::Pull(int64_t version, int64_t have_version,
                                               absl::Span<const int> tensors,
                                               absl::Span<const absl::Span<std::byte>> dst,
                                               double* loss_scale, CallGroup* cancel,
                                               const std::function<void()>& registered) {
  OnceAllArrived parts_registered(registered);
  ZO_RETURN_IF_ERROR(CheckState());
  if (version < 0 || have_version < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot pull version ", version, " over version ", have_version));
  }
  if (tensors.empty() || tensors.size() != dst.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pull of ", tensors.size(), " tensors into ", dst.size(), " buffers"));
  }
  std::vector<bool> seen(map.tensors().size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int t = tensors[i];
    ZO_RETURN_IF_ERROR(CheckTensorIndex(t));
    if (seen[t]) {
      return absl::InvalidArgumentError(
          absl::StrCat(TensorLabel(t), " is asked for twice in one pull"));
    }
    seen[t] = true;
    const int64_t want = map.TensorRange(t).size() * elem_bytes;
    if (static_cast<int64_t>(dst[i].size()) != want) {
      return absl::InvalidArgumentError(absl::StrCat("the buffer for ", TensorLabel(t), " has ",
                                                     dst[i].size(), " bytes; it needs ", want));
    }
  }

  // Per server, one call per stripe (PullStripes: one per connection).
  struct Part {
    int server, stripe, stripes;
  };
  std::vector<Part> parts;
  std::vector<std::unique_ptr<PullReceiver>> receivers;
  for (int s = 0; s < map.num_servers(); ++s) {
    const int stripes = PullStripes(s);
    for (int stripe = 0; stripe < stripes; ++stripe) {
      auto receiver =
          std::make_unique<PullReceiver>(map, dtype, s, version, have_version, tensors, dst,
                                         client_internal::PullStripe{stripe, stripes});
      if (receiver->tensors().empty()) continue;  // owns nothing of these tensors
      parts.push_back({s, stripe, stripes});
      receivers.push_back(std::move(receiver));
    }
  }
  if (receivers.empty()) return true;  // only empty tensors: dst holds any version

  CallGroup group;
  if (cancel != nullptr && !cancel->AddChild(&group)) {
    return absl::CancelledError(absl::StrCat("the pull of version ", version, " was cancelled"));
  }
  parts_registered.Expect(receivers.size());
  const std::function<void()> part_registered = parts_registered.ArriveFn();
  absl::Status pulled = RunInParallel(receivers.size(), group, [&](size_t i) {
    return PullFrom(parts[i].server, parts[i].stripe, parts[i].stripes, version, have_version,
                    *receivers[i], group, part_registered);
  });
  if (cancel != nullptr) cancel->RemoveChild(&group);
  if (!pulled.ok()) return WithStuckPeer(std::move(pulled));

  const bool unchanged =
      std::all_of(receivers.begin(), receivers.end(), [](const auto& r) { return r->unchanged(); });
  if (!unchanged) {
    int64_t bytes = 0;
    for (const absl::Span<std::byte>& d : dst) bytes += static_cast<int64_t>(d.size());
    pulled_bytes.fetch_add(bytes, std::memory_order_relaxed);
  }
  if (loss_scale != nullptr) *loss_scale = receivers.front()->loss_scale();
  {
    // A server answers a pull once the update that made the version has
    // ended: it reads no gradient of that step or before any more.
    std::lock_guard lock(mu);
    for (const Part& part : parts) {
      if (static_cast<size_t>(part.server) < pulled_through.size()) {
        pulled_through[part.server] = std::max(pulled_through[part.server], version);
      }
    }
  }
  {
    std::lock_guard lock(state_mu);
    if (version >= this->version) {
      this->version = version;
      this->loss_scale = receivers.front()->loss_scale();
    }
  }
  return !unchanged;
}

PullCancellation::PullCancellation() : group_(std::make_unique<CallGroup>()) {}
PullCancellation::~PullCancellation() = default;
void PullCancellation::Cancel() { group_->CancelAll(); }
bool PullCancellation::cancelled() const { return group_->cancelled(); }

absl::StatusOr<bool> OffloadClient::Pull(int64_t version, int64_t have_version,
                                         absl::Span<const int> tensors,
                                         absl::Span<const absl::Span<std::byte>> dst,
                                         PullCancellation* cancel) {
  return impl_->Pull(version, have_version, tensors, dst, nullptr,
                     cancel != nullptr ? cancel->group_.get() : nullptr);
}

int64_t OffloadClient::last_pulled_version() const {
  std::lock_guard lock(impl_->pull_for_step_mu);
  return impl_->pulled_version;
}

absl::StatusOr<bool> OffloadClient::PullForStep(int64_t step, absl::Span<const int> tensors,
                                                absl::Span<const absl::Span<std::byte>> dst,
                                                double* loss_scale, PullCancellation* cancel) {
  const PullBatch whole{.tensors = tensors, .dst = dst};
  return PullForStepInBatches(step, {&whole, 1}, nullptr, loss_scale, cancel);
}

absl::StatusOr<int64_t> OffloadClient::Impl::StepVersion(int64_t step) {
  if (step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot pull for step ", step, ": steps are numbered from 1"));
  }
  // After a restore to v_r the servers hold v_{r-1} only when the
  // checkpoint kept it; otherwise the first step of a resumed DPU run
  // computes on v_r rather than v_{r-1}.
  std::lock_guard state_lock(state_mu);
  return std::max(VersionForStep(config.zo.dpu, step), base_version);
}

absl::StatusOr<bool> OffloadClient::PullForStepInBatches(
    int64_t step, absl::Span<const PullBatch> batches,
    const std::function<absl::Status(size_t batch)>& pulled, double* loss_scale,
    PullCancellation* cancel) {
  std::lock_guard lock(impl_->pull_for_step_mu);
  ZO_ASSIGN_OR_RETURN(const int64_t version, impl_->StepVersion(step));
  bool changed = false;
  if (version != impl_->pulled_version) {
    const int64_t have = impl_->pulled_version;
    // A failed pull may have written part of dst, or handed part of the
    // version on: the next call pulls whole.
    impl_->pulled_version = -1;
    for (size_t b = 0; b < batches.size(); ++b) {
      ZO_ASSIGN_OR_RETURN(
          const bool batch_changed,
          impl_->Pull(version, have, batches[b].tensors, batches[b].dst, &impl_->pulled_loss_scale,
                      cancel != nullptr ? cancel->group_.get() : nullptr));
      // One version against another is unchanged everywhere or nowhere.
      if (b == 0) {
        changed = batch_changed;
        if (!changed) break;
      } else if (!batch_changed) {
        return absl::InternalError(absl::StrCat("the pull of version ", version, " over version ",
                                                have, " changed batch 0 but not batch ", b));
      }
      if (pulled) {
        if (loss_scale != nullptr) *loss_scale = impl_->pulled_loss_scale;
        ZO_RETURN_IF_ERROR(pulled(b));
      }
    }
    impl_->pulled_version = version;
  }
  if (loss_scale != nullptr) *loss_scale = impl_->pulled_loss_scale;
  return changed;
}

absl::StatusOr<bool> OffloadClient::PullForStepAsWritten(
    int64_t step, absl::Span<const PullBatch> batches,
    const std::function<absl::Status(size_t batch)>& arrived,
    const std::function<void()>& registered, double* loss_scale, PullCancellation* cancel) {
  OnceAllArrived batches_registered(registered);
  std::lock_guard lock(impl_->pull_for_step_mu);
  ZO_ASSIGN_OR_RETURN(const int64_t version, impl_->StepVersion(step));
  if (version != impl_->pulled_version) {
    const int64_t have = impl_->pulled_version;
    // A failed pull may have written part of dst: the next call pulls whole.
    impl_->pulled_version = -1;
    // A batch of tensors without elements holds any version: it is not
    // pulled, and arrives once the others said whether the version changed.
    const auto empty = [&](size_t b) {
      return std::all_of(batches[b].dst.begin(), batches[b].dst.end(),
                         [](const absl::Span<std::byte>& d) { return d.empty(); });
    };
    std::mutex mu;
    std::optional<bool> changed;  // guarded by mu; the first batch's answer
    double scale = 1;             // guarded by mu
    CallGroup group;
    if (cancel != nullptr && !cancel->group_->AddChild(&group)) {
      return absl::CancelledError(absl::StrCat("the pull of version ", version, " was cancelled"));
    }
    size_t pulled_batches = 0;
    for (size_t b = 0; b < batches.size(); ++b) pulled_batches += empty(b) ? 0 : 1;
    batches_registered.Expect(pulled_batches);
    const std::function<void()> batch_registered = batches_registered.ArriveFn();
    absl::Status pulled = RunInParallel(batches.size(), group, [&](size_t b) -> absl::Status {
      if (empty(b)) return absl::OkStatus();
      double batch_scale = 1;
      ZO_ASSIGN_OR_RETURN(const bool batch_changed,
                          impl_->Pull(version, have, batches[b].tensors, batches[b].dst,
                                      &batch_scale, &group, batch_registered));
      {
        std::lock_guard batch_lock(mu);
        if (!changed.has_value()) {
          changed = batch_changed;
          scale = batch_scale;
          if (loss_scale != nullptr) *loss_scale = scale;
        } else if (*changed != batch_changed) {
          // One version against another is unchanged everywhere or nowhere.
          return absl::InternalError(absl::StrCat("the pull of version ", version, " over version ",
                                                  have, " changed some batches but not others"));
        }
      }
      return batch_changed && arrived ? arrived(b) : absl::OkStatus();
    });
    if (cancel != nullptr) cancel->group_->RemoveChild(&group);
    ZO_RETURN_IF_ERROR(pulled);
    if (changed.value_or(true) && arrived) {
      for (size_t b = 0; b < batches.size(); ++b) {
        if (empty(b)) ZO_RETURN_IF_ERROR(arrived(b));
      }
    }
    impl_->pulled_loss_scale = scale;
    impl_->pulled_version = version;
    if (loss_scale != nullptr) *loss_scale = scale;
    return changed.value_or(true);
  }
  if (loss_scale != nullptr) *loss_scale = impl_->pulled_loss_scale;
  return false;
}

}  // namespace zo
