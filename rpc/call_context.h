// How every client call of zo starts: a context with a deadline and, when
// the servers have one, the auth token (`authorization: Bearer <token>`,
// rpc/rpc_util.h). Used by the worker's client, a server's peer calls and
// zo-ctl.
//
//   std::unique_ptr<grpc::ClientContext> context =
//       NewCallContext({.timeout = absl::Seconds(30), .auth_token = token});
//   grpc::Status s = stub->GetJobStatus(context.get(), request, &status);
#ifndef ZO_RPC_CALL_CONTEXT_H_
#define ZO_RPC_CALL_CONTEXT_H_

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "grpcpp/client_context.h"

namespace zo {

struct CallOptions {
  // How long the call may take, from when its context is made.
  absl::Duration timeout = absl::Seconds(30);
  std::string auth_token = "";  // empty: no authorization metadata
};

// Sets `context`'s deadline to now + options.timeout and adds the token.
// Call once per context, before the call starts.
void PrepareCallContext(const CallOptions& options, grpc::ClientContext& context);

// A fresh context prepared by PrepareCallContext (a ClientContext can serve
// one call only, and cannot be moved).
std::unique_ptr<grpc::ClientContext> NewCallContext(const CallOptions& options);

}  // namespace zo

#endif  // ZO_RPC_CALL_CONTEXT_H_
