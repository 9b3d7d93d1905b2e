#include "ctl/rpc_target.h"

#include <utility>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "common/command_line.h"
#include "common/status_macros.h"
#include "rpc/channel.h"
#include "rpc/rpc_util.h"

namespace zo::ctl {

absl::StatusOr<RpcTarget> RpcTargetFor(const std::string& server) {
  RpcTarget target;
  target.server = server;
  const int timeout_s = absl::GetFlag(FLAGS_timeout);
  if (timeout_s < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout must be >= 1 second, got ", timeout_s));
  }
  target.call.timeout = absl::Seconds(timeout_s);
  if (const std::string file = absl::GetFlag(FLAGS_auth_token_file); !file.empty()) {
    ZO_ASSIGN_OR_RETURN(target.call.auth_token, ReadTokenFile("auth-token-file", file));
  }
  ChannelOptions channel;
  if (const std::string ca = absl::GetFlag(FLAGS_tls_ca); !ca.empty()) {
    ZO_ASSIGN_OR_RETURN(channel.tls_root_certs, ReadFlagFile("tls-ca", ca));
    target.tls = true;
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> made = NewChannel(target.server, channel);
  if (!made.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--server ", made.status().message()));
  }
  target.stub = v1::Offload::NewStub(*std::move(made));
  return target;
}

absl::StatusOr<RpcTarget> RpcTargetFromFlags() {
  if (absl::GetFlag(FLAGS_server).empty() || absl::GetFlag(FLAGS_job).empty()) {
    return absl::InvalidArgumentError("give --server HOST:PORT and --job NAME");
  }
  return RpcTargetFor(absl::GetFlag(FLAGS_server));
}

std::string DescribeRpcError(const RpcTarget& target, const grpc::Status& status) {
  const absl::Status s = FromGrpcStatus(status);
  std::string line = absl::StrCat(absl::StatusCodeToString(s.code()), ": ",
                                  absl::StrReplaceAll(s.message(), {{"\n", " "}}));
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
      absl::StrAppend(&line, " (is zo-server running at ", target.server, "?",
                      target.tls ? "" : " if it serves TLS, give --tls-ca", ")");
      break;
    case absl::StatusCode::kDeadlineExceeded:
      absl::StrAppend(&line, " (no answer from ", target.server, " within ",
                      absl::FormatDuration(target.call.timeout), "; raise --timeout?)");
      break;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      absl::StrAppend(&line, " (check --auth-token-file against the server's token)");
      break;
    default:
      break;
  }
  return line;
}

absl::StatusOr<v1::JobStatus> JobStatusOn(const RpcTarget& target, const std::string& job) {
  v1::GetJobStatusRequest request;
  request.set_job(job);
  v1::JobStatus status;
  grpc::ClientContext context;
  PrepareCallContext(target.call, context);
  if (grpc::Status rpc = target.stub->GetJobStatus(&context, request, &status); !rpc.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(rpc.error_code()),
                        DescribeRpcError(target, rpc));
  }
  return status;
}

}  // namespace zo::ctl
