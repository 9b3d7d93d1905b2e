#include "server/peer_client.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "rpc/call_context.h"
#include "rpc/channel.h"
#include "rpc/error_detail.h"
#include "rpc/rpc_util.h"

namespace zo {
namespace {

absl::Status Named(const std::string& address, const char* call, const grpc::Status& s) {
  return WithContext(FromGrpcStatus(s), absl::StrCat(call, " to server ", address));
}

}  // namespace

PeerClient::PeerClient(PeerCredentials credentials) : credentials_(std::move(credentials)) {}

absl::StatusOr<v1::Offload::Stub*> PeerClient::StubFor(const std::string& address) {
  std::lock_guard lock(mu_);
  auto it = stubs_.find(address);
  if (it == stubs_.end()) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        NewChannel(address, {.tls_root_certs = credentials_.tls_root_certs});
    if (!channel.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer server ", address, ": ", channel.status().message()));
    }
    it = stubs_.emplace(address, v1::Offload::NewStub(*std::move(channel))).first;
  }
  return it->second.get();
}

template <typename Response, typename Call>
absl::StatusOr<Response> PeerClient::Unary(const std::string& address, const char* what,
                                           absl::Duration timeout, Call call, bool wait_for_ready) {
  ZO_ASSIGN_OR_RETURN(v1::Offload::Stub * stub, StubFor(address));
  grpc::ClientContext context;
  PrepareCallContext({.timeout = timeout, .auth_token = credentials_.auth_token}, context);
  context.set_wait_for_ready(wait_for_ready);
  Response response;
  ZO_RETURN_IF_ERROR(Named(address, what, call(*stub, context, response)));
  return response;
}

absl::Status PeerClient::ReportStepStats(const std::string& address, const v1::StepStats& stats,
                                         absl::Duration timeout) {
  return Unary<v1::StepStatsResponse>(
             address, "ReportStepStats", timeout,
             [&](v1::Offload::Stub& stub, grpc::ClientContext& c, v1::StepStatsResponse& r) {
               return stub.ReportStepStats(&c, stats, &r);
             })
      .status();
}

absl::Status PeerClient::CommitStep(const std::string& address, const v1::StepCommit& commit,
                                    absl::Duration timeout) {
  return Unary<v1::StepCommitResponse>(
             address, "CommitStep", timeout,
             [&](v1::Offload::Stub& stub, grpc::ClientContext& c, v1::StepCommitResponse& r) {
               return stub.CommitStep(&c, commit, &r);
             })
      .status();
}

absl::StatusOr<v1::WriteCheckpointPartResponse> PeerClient::WriteCheckpointPart(
    const std::string& address, const v1::WriteCheckpointPartRequest& request,
    absl::Duration timeout) {
  return Unary<v1::WriteCheckpointPartResponse>(
      address, "WriteCheckpointPart", timeout,
      [&](v1::Offload::Stub& stub, grpc::ClientContext& c, v1::WriteCheckpointPartResponse& r) {
        return stub.WriteCheckpointPart(&c, request, &r);
      });
}

absl::StatusOr<v1::OpenJobResponse> PeerClient::OpenJob(const std::string& address,
                                                        const v1::OpenJobRequest& request,
                                                        absl::Duration timeout) {
  // A server just (re)started may not be connected yet: wait for it, within
  // the deadline, rather than fail on the channel's last refusal.
  return Unary<v1::OpenJobResponse>(
      address, "OpenJob", timeout,
      [&](v1::Offload::Stub& stub, grpc::ClientContext& c, v1::OpenJobResponse& r) {
        return stub.OpenJob(&c, request, &r);
      },
      /*wait_for_ready=*/true);
}

absl::Status PeerClient::CloseJob(const std::string& address, const v1::CloseJobRequest& request,
                                  absl::Duration timeout) {
  return Unary<v1::CloseJobResponse>(
             address, "CloseJob", timeout,
             [&](v1::Offload::Stub& stub, grpc::ClientContext& c, v1::CloseJobResponse& r) {
               return stub.CloseJob(&c, request, &r);
             })
      .status();
}

absl::StatusOr<v1::JobStatus> PeerClient::GetJobStatus(const std::string& address,
                                                       const std::string& job,
                                                       absl::Duration timeout,
                                                       bool wait_for_ready) {
  v1::GetJobStatusRequest request;
  request.set_job(job);
  return Unary<v1::JobStatus>(
      address, "GetJobStatus", timeout,
      [&](v1::Offload::Stub& stub, grpc::ClientContext& c, v1::JobStatus& r) {
        return stub.GetJobStatus(&c, request, &r);
      },
      wait_for_ready);
}

absl::Status PeerClient::RestorePart(const std::string& address,
                                     const v1::RestorePartRequest& request,
                                     absl::Duration timeout) {
  return Unary<v1::RestorePartResponse>(
             address, "RestorePart", timeout,
             [&](v1::Offload::Stub& stub, grpc::ClientContext& c, v1::RestorePartResponse& r) {
               return stub.RestorePart(&c, request, &r);
             })
      .status();
}

}  // namespace zo
