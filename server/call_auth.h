// The token check every zo.v1 call of a server passes first: the call must
// carry `authorization: Bearer <token>` (rpc/rpc_util.h) when the server has
// a token. Compared in constant time.
#ifndef ZO_SERVER_CALL_AUTH_H_
#define ZO_SERVER_CALL_AUTH_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/server_context.h"

namespace zo {

class CallAuth {
 public:
  // `token` empty: every call passes.
  explicit CallAuth(std::string token) : token_(std::move(token)) {}

  // UNAUTHENTICATED unless the call carries the token (or none is set).
  // Sync and callback contexts alike.
  absl::Status Check(const grpc::ServerContextBase& context) const;

 private:
  const std::string token_;
};

}  // namespace zo

#endif  // ZO_SERVER_CALL_AUTH_H_
