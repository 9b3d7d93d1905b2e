// OffloadClient's calls to the job's lead: status, step learning rates
// (which the followers hear too), checkpoint and restore.
#include <mutex>
#include <string>

#include "common/status_macros.h"
#include "rpc/in_process_route.h"
#include "rpc/proto_convert.h"
#include "worker/client/internal/call.h"
#include "worker/client/internal/offload_client_impl.h"
#include "worker/client/offload_client.h"

namespace zo {

void OffloadClient::Impl::SetStatus(const v1::JobStatus& status) {
  std::lock_guard lock(state_mu);
  version = status.version();
  loss_scale = status.loss_scale();
  base_version = status.base_version();
}

absl::Status OffloadClient::SetStepLr(int64_t step, absl::Span<const double> group_lr,
                                      absl::Span<const ParamGroupConfig> group_hyper) {
  v1::StepLrRequest request;
  request.set_job(impl_->options.job);
  request.set_step(step);
  request.set_dp_rank(impl_->options.dp_rank);
  for (double lr : group_lr) request.add_group_lr(lr);
  for (const ParamGroupConfig& g : group_hyper) {
    v1::GroupHyper& h = *request.add_group_hyper();
    h.set_beta1(g.betas[0]);
    h.set_beta2(g.betas[1]);
    h.set_eps(g.eps);
    h.set_weight_decay(g.weight_decay);
  }
  // The followers decide nothing with the rates; they guess the step with
  // them and update each chunk as its gradients come (the speculative
  // update). One short attempt each, beside the lead's call: one that
  // misses them updates later, so their errors are dropped.
  client_internal::CallSettings once = impl_->call;
  once.attempt.timeout = absl::Seconds(2);
  once.retry_for = absl::ZeroDuration();
  client_internal::CallGroup group;
  return client_internal::RunInParallel(impl_->stubs.size(), group, [&](size_t i) -> absl::Status {
    const int server = static_cast<int>(i);
    v1::StepLrRequest to_server = request;
    to_server.set_incarnation(impl_->incarnation[i].load(std::memory_order_relaxed));
    // An embedded server takes them as a call: no round trip through its
    // channel every step (0.42-0.47 ms of a zo.torch step, 32 Mi parameters).
    if (const std::shared_ptr<InProcessRoute>& route = impl_->routes[i]; route != nullptr) {
      const absl::Status set = route->SetStepLr(to_server);
      return server == 0 ? set : absl::OkStatus();
    }
    const auto call = [&](v1::Offload::Stub& stub, grpc::ClientContext& context,
                          v1::StepLrResponse& r) {
      return stub.SetStepLr(&context, to_server, &r);
    };
    if (server == 0) return impl_->Unary<v1::StepLrResponse>(0, call).status();
    (void)impl_->Unary<v1::StepLrResponse>(once, server, call, nullptr);
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<WeightsCompensation>> OffloadClient::StepCompensation(int64_t step,
                                                                                 bool have_before) {
  v1::StepCompensationRequest request;
  request.set_job(impl_->options.job);
  request.set_step(step);
  std::vector<std::vector<CompensationTerms>> parts(impl_->map.tensors().size());
  for (int server = 0; server < static_cast<int>(impl_->stubs.size()); ++server) {
    request.set_incarnation(impl_->incarnation[server].load(std::memory_order_relaxed));
    ZO_ASSIGN_OR_RETURN(const v1::StepCompensation reply,
                        impl_->Unary<v1::StepCompensation>(
                            server, [&](v1::Offload::Stub& stub, grpc::ClientContext& context,
                                        v1::StepCompensation& r) {
                              return stub.GetStepCompensation(&context, request, &r);
                            }));
    for (const v1::TensorCompensation& t : reply.tensors()) {
      if (t.tensor() < 0 || t.tensor() >= static_cast<int>(parts.size())) {
        return absl::InternalError(absl::StrCat("server ", impl_->names[server],
                                                " sent compensation terms of tensor ", t.tensor(),
                                                ", outside the manifest"));
      }
      parts[static_cast<size_t>(t.tensor())].push_back(CompensationTermsFromProto(t));
    }
  }
  std::vector<WeightsCompensation> out;
  out.reserve(parts.size());
  for (const std::vector<CompensationTerms>& p : parts) {
    ZO_ASSIGN_OR_RETURN(WeightsCompensation w, CombineTerms(p, have_before));
    out.push_back(w);
  }
  return out;
}

absl::StatusOr<v1::JobStatus> OffloadClient::JobStatus() {
  v1::GetJobStatusRequest request;
  request.set_job(impl_->options.job);
  ZO_ASSIGN_OR_RETURN(
      v1::JobStatus status,
      impl_->Unary<v1::JobStatus>(
          0, [&](v1::Offload::Stub& stub, grpc::ClientContext& context, v1::JobStatus& response) {
            return stub.GetJobStatus(&context, request, &response);
          }));
  impl_->SetStatus(status);
  return status;
}

absl::StatusOr<std::string> OffloadClient::Checkpoint(int64_t min_version) {
  v1::CheckpointRequest request;
  request.set_job(impl_->options.job);
  request.set_min_version(min_version);
  ZO_ASSIGN_OR_RETURN(
      v1::CheckpointResponse response,
      impl_->Unary<v1::CheckpointResponse>(
          0, [&](v1::Offload::Stub& stub, grpc::ClientContext& context, v1::CheckpointResponse& r) {
            return stub.Checkpoint(&context, request, &r);
          }));
  return response.path();
}

absl::StatusOr<int64_t> OffloadClient::Restore(const std::string& path, bool rollback) {
  v1::RestoreRequest request;
  request.set_job(impl_->options.job);
  request.set_path(path);
  request.set_rollback(rollback);
  ZO_ASSIGN_OR_RETURN(const v1::RestoreResponse response, RestoreCall(request));
  return response.version();
}

absl::StatusOr<v1::RestoreResponse> OffloadClient::RestoreOnce(const std::string& path,
                                                               int64_t seen_restores) {
  v1::RestoreRequest request;
  request.set_job(impl_->options.job);
  request.set_path(path);
  request.set_if_restores(seen_restores);
  return RestoreCall(request);
}

absl::StatusOr<v1::RestoreResponse> OffloadClient::RestoreCall(const v1::RestoreRequest& request) {
  const bool rollback = request.rollback();
  ZO_ASSIGN_OR_RETURN(
      v1::RestoreResponse response,
      impl_->Unary<v1::RestoreResponse>(
          0, [&](v1::Offload::Stub& stub, grpc::ClientContext& context, v1::RestoreResponse& r) {
            return stub.Restore(&context, request, &r);
          }));
  // A rollback made a new instance of the job on every server: this
  // client's calls go to it from now on.
  for (int i = 0; rollback && i < impl_->map.num_servers(); ++i) {
    v1::GetJobStatusRequest status_request;
    status_request.set_job(impl_->options.job);
    ZO_ASSIGN_OR_RETURN(
        v1::JobStatus status,
        impl_->Unary<v1::JobStatus>(
            i, [&](v1::Offload::Stub& stub, grpc::ClientContext& context, v1::JobStatus& st) {
              return stub.GetJobStatus(&context, status_request, &st);
            }));
    impl_->incarnation[i] = status.incarnation();
  }
  // A server that restarted holds none of this worker's regions.
  if (rollback && !impl_->regions.empty()) impl_->AttachRegions();
  // Whatever PullForStep put in the caller's buffers is not the restored
  // weights, even at an equal version number.
  std::lock_guard pull_lock(impl_->pull_for_step_mu);
  impl_->pulled_version = -1;
  std::lock_guard state_lock(impl_->state_mu);
  impl_->version = response.version();
  // With a delayed parameter update the checkpoint may have kept the
  // version the next step computes on: then that is the oldest.
  impl_->base_version = response.base_version();
  impl_->lost_state.clear();  // every server holds the restored state now
  return response;
}

}  // namespace zo
