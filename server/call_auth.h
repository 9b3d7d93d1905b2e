// The token check every zo.v1 call of a server passes first: the call must
// carry `authorization: Bearer <token>` (rpc/rpc_util.h) when the server has
// a token. Compared in constant time. Refusals are logged without the token,
// one line per client host every few seconds, and a host that keeps failing
// waits longer for each refusal (server/auth_failures.h).
#ifndef ZO_SERVER_CALL_AUTH_H_
#define ZO_SERVER_CALL_AUTH_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/server_context.h"
#include "server/auth_failures.h"

namespace zo {

class CallAuth {
 public:
  // `token` empty: every call passes.
  explicit CallAuth(std::string token) : token_(std::move(token)) {}

  // UNAUTHENTICATED unless the call carries the token (or none is set).
  // Sync and callback contexts alike. Past AuthFailures::kFreeFailures
  // from one host a minute, the refusal is held back a little first.
  absl::Status Check(const grpc::ServerContextBase& context) const;

  CallAuth(const CallAuth&) = delete;
  CallAuth& operator=(const CallAuth&) = delete;

 private:
  absl::Status CheckToken(const grpc::ServerContextBase& context) const;

  const std::string token_;
  mutable AuthFailures failures_;
};

}  // namespace zo

#endif  // ZO_SERVER_CALL_AUTH_H_
