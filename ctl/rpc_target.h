// zo-ctl's way to one zo-server: a stub with the --auth-token-file,
// --tls-ca and --timeout flags applied, and a failed call described in one
// line for people. Shared by the commands that call servers.
#ifndef ZO_CTL_RPC_TARGET_H_
#define ZO_CTL_RPC_TARGET_H_

#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "rpc/call_context.h"

// The calling commands' flags, defined in ctl/rpc_commands.cc.
ABSL_DECLARE_FLAG(std::string, server);
ABSL_DECLARE_FLAG(std::string, job);
ABSL_DECLARE_FLAG(std::string, auth_token_file);
ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(int, timeout);

namespace zo::ctl {

// What a status or checkpoint call needs besides its request.
struct RpcTarget {
  std::string server;
  std::unique_ptr<v1::Offload::Stub> stub;
  CallOptions call;
  bool tls = false;
};

// A target at `server` with the token, TLS and timeout flags, or an error
// naming the flag that is wrong or whose file cannot be read.
absl::StatusOr<RpcTarget> RpcTargetFor(const std::string& server);

// --server and --job, both required.
absl::StatusOr<RpcTarget> RpcTargetFromFlags();

// One line: the code, the server's message and what to check.
std::string DescribeRpcError(const RpcTarget& target, const grpc::Status& status);

// The job's status on `target`, or the call's failure described for people.
absl::StatusOr<v1::JobStatus> JobStatusOn(const RpcTarget& target, const std::string& job);

}  // namespace zo::ctl

#endif  // ZO_CTL_RPC_TARGET_H_
