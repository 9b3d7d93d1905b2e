#include "server/peer_client.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "proto/rpc_util.h"

namespace zo {
namespace {

absl::Status Named(const std::string& address, const char* call, const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(call, " to server ", address, ": ", s.error_message()));
}

}  // namespace

PeerClient::PeerClient(PeerCredentials credentials) : credentials_(std::move(credentials)) {}

v1::Offload::Stub* PeerClient::StubFor(const std::string& address) {
  std::lock_guard lock(mu_);
  auto it = stubs_.find(address);
  if (it == stubs_.end()) {
    std::shared_ptr<grpc::ChannelCredentials> creds =
        credentials_.tls_root_certs.empty() ? grpc::InsecureChannelCredentials()
                                            : grpc::SslCredentials(grpc::SslCredentialsOptions{
                                                  credentials_.tls_root_certs, "", ""});
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetMaxSendMessageSize(64 << 20);
    it =
        stubs_
            .emplace(address, v1::Offload::NewStub(grpc::CreateCustomChannel(address, creds, args)))
            .first;
  }
  return it->second.get();
}

void PeerClient::Prepare(grpc::ClientContext& context, absl::Duration timeout) const {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!credentials_.auth_token.empty()) {
    context.AddMetadata(kAuthMetadataKey, BearerValue(credentials_.auth_token));
  }
}

absl::Status PeerClient::ReportStepStats(const std::string& address, const v1::StepStats& stats,
                                         absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(context, timeout);
  v1::StepStatsResponse response;
  return Named(address, "ReportStepStats",
               StubFor(address)->ReportStepStats(&context, stats, &response));
}

absl::Status PeerClient::CommitStep(const std::string& address, const v1::StepCommit& commit,
                                    absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(context, timeout);
  v1::StepCommitResponse response;
  return Named(address, "CommitStep", StubFor(address)->CommitStep(&context, commit, &response));
}

absl::StatusOr<v1::WriteCheckpointPartResponse> PeerClient::WriteCheckpointPart(
    const std::string& address, const v1::WriteCheckpointPartRequest& request,
    absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(context, timeout);
  v1::WriteCheckpointPartResponse response;
  absl::Status s = Named(address, "WriteCheckpointPart",
                         StubFor(address)->WriteCheckpointPart(&context, request, &response));
  if (!s.ok()) return s;
  return response;
}

absl::Status PeerClient::RestorePart(const std::string& address,
                                     const v1::RestorePartRequest& request,
                                     absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(context, timeout);
  v1::RestorePartResponse response;
  return Named(address, "RestorePart", StubFor(address)->RestorePart(&context, request, &response));
}

}  // namespace zo
