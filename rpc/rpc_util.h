// What both ends of the protocol agree on beyond the messages: status
// conversion between Abseil and gRPC (the codes are the same numbers) and the
// auth metadata.
#ifndef ZO_RPC_RPC_UTIL_H_
#define ZO_RPC_RPC_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace zo {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// Every call carries `authorization: Bearer <token>` when the server has a token.
inline constexpr char kAuthMetadataKey[] = "authorization";
inline std::string BearerValue(const std::string& token) { return "Bearer " + token; }

// Protocol revision reported by GetServerInfo; bumped on incompatible changes.
inline constexpr unsigned kProtocolRevision = 1;

}  // namespace zo

#endif  // ZO_RPC_RPC_UTIL_H_
