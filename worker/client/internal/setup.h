// What OffloadClient::Open checks and builds before it talks to a server:
// the options, the job's dtype, the channels.
#ifndef ZO_WORKER_CLIENT_INTERNAL_SETUP_H_
#define ZO_WORKER_CLIENT_INTERNAL_SETUP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "common/config.h"
#include "common/dtype.h"
#include "grpcpp/channel.h"
#include "worker/client/offload_client.h"

namespace zo::client_internal {

// The protocol's bound on one message (DESIGN.md, "Failure, bad input"),
// above gRPC's 4 MiB default so that pieces of a few MiB pass.
inline constexpr int kMaxMessageBytes = 64 << 20;
// Room for a GradientPiece's fields other than its data (a job name is at
// most 128 bytes).
inline constexpr int64_t kPieceOverheadBytes = 1024;

// The dtype of every tensor of the job, and the config setting that decides
// it (for error messages).
std::pair<DType, const char*> JobDType(const Config& config);

// INVALID_ARGUMENT naming the option for options Open cannot work with.
absl::Status ValidateOptions(const ClientOptions& options, int64_t elem_bytes);

// A channel to `address` sized for the protocol's messages and tuned for
// long streams; TLS when `tls_root_certs` (PEM) is non-empty.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const std::string& tls_root_certs);

}  // namespace zo::client_internal

#endif  // ZO_WORKER_CLIENT_INTERNAL_SETUP_H_
