#include "server/peer_client.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "rpc/call_context.h"
#include "rpc/channel.h"

namespace zo {
namespace {

absl::Status Named(const std::string& address, const char* call, const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(call, " to server ", address, ": ", s.error_message()));
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

void PeerClient::Prepare(grpc::ClientContext& context, absl::Duration timeout) const {
  PrepareCallContext({.timeout = timeout, .auth_token = credentials_.auth_token}, context);
}

absl::Status PeerClient::ReportStepStats(const std::string& address, const v1::StepStats& stats,
                                         absl::Duration timeout) {
  ZO_ASSIGN_OR_RETURN(v1::Offload::Stub * stub, StubFor(address));
  grpc::ClientContext context;
  Prepare(context, timeout);
  v1::StepStatsResponse response;
  return Named(address, "ReportStepStats", stub->ReportStepStats(&context, stats, &response));
}

absl::Status PeerClient::CommitStep(const std::string& address, const v1::StepCommit& commit,
                                    absl::Duration timeout) {
  ZO_ASSIGN_OR_RETURN(v1::Offload::Stub * stub, StubFor(address));
  grpc::ClientContext context;
  Prepare(context, timeout);
  v1::StepCommitResponse response;
  return Named(address, "CommitStep", stub->CommitStep(&context, commit, &response));
}

absl::StatusOr<v1::WriteCheckpointPartResponse> PeerClient::WriteCheckpointPart(
    const std::string& address, const v1::WriteCheckpointPartRequest& request,
    absl::Duration timeout) {
  ZO_ASSIGN_OR_RETURN(v1::Offload::Stub * stub, StubFor(address));
  grpc::ClientContext context;
  Prepare(context, timeout);
  v1::WriteCheckpointPartResponse response;
  absl::Status s = Named(address, "WriteCheckpointPart",
                         stub->WriteCheckpointPart(&context, request, &response));
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::OpenJobResponse> PeerClient::OpenJob(const std::string& address,
                                                        const v1::OpenJobRequest& request,
                                                        absl::Duration timeout) {
  ZO_ASSIGN_OR_RETURN(v1::Offload::Stub * stub, StubFor(address));
  grpc::ClientContext context;
  Prepare(context, timeout);
  // A server just (re)started may not be connected yet: wait for it, within
  // the deadline, rather than fail on the channel's last refusal.
  context.set_wait_for_ready(true);
  v1::OpenJobResponse response;
  ZO_RETURN_IF_ERROR(Named(address, "OpenJob", stub->OpenJob(&context, request, &response)));
  return response;
}

absl::Status PeerClient::CloseJob(const std::string& address, const v1::CloseJobRequest& request,
                                  absl::Duration timeout) {
  ZO_ASSIGN_OR_RETURN(v1::Offload::Stub * stub, StubFor(address));
  grpc::ClientContext context;
  Prepare(context, timeout);
  v1::CloseJobResponse response;
  return Named(address, "CloseJob", stub->CloseJob(&context, request, &response));
}

absl::StatusOr<v1::JobStatus> PeerClient::GetJobStatus(const std::string& address,
                                                       const std::string& job,
                                                       absl::Duration timeout) {
  ZO_ASSIGN_OR_RETURN(v1::Offload::Stub * stub, StubFor(address));
  grpc::ClientContext context;
  Prepare(context, timeout);
  v1::GetJobStatusRequest request;
  request.set_job(job);
  v1::JobStatus response;
  ZO_RETURN_IF_ERROR(
      Named(address, "GetJobStatus", stub->GetJobStatus(&context, request, &response)));
  return response;
}

absl::Status PeerClient::RestorePart(const std::string& address,
                                     const v1::RestorePartRequest& request,
                                     absl::Duration timeout) {
  ZO_ASSIGN_OR_RETURN(v1::Offload::Stub * stub, StubFor(address));
  grpc::ClientContext context;
  Prepare(context, timeout);
  v1::RestorePartResponse response;
  return Named(address, "RestorePart", stub->RestorePart(&context, request, &response));
}

}  // namespace zo
