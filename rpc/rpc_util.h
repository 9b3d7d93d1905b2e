// What both ends of the protocol agree on beyond the messages: status
// conversion between Abseil and gRPC (the codes are the same numbers, and a
// v1::ErrorDetail payload travels in the status details, rpc/error_detail.h)
// and the auth metadata.
#ifndef ZO_RPC_RPC_UTIL_H_
#define ZO_RPC_RPC_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace zo {

grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

// Every call carries `authorization: Bearer <token>` when the server has a token.
inline constexpr char kAuthMetadataKey[] = "authorization";
inline std::string BearerValue(const std::string& token) { return "Bearer " + token; }

// Protocol revision reported by GetServerInfo; bumped on incompatible changes.
inline constexpr unsigned kProtocolRevision = 1;

}  // namespace zo

#endif  // ZO_RPC_RPC_UTIL_H_
