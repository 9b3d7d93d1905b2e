// What OffloadClient::Open checks and builds before it talks to a server:
// the options and the job's dtype.
#ifndef ZO_WORKER_CLIENT_INTERNAL_SETUP_H_
#define ZO_WORKER_CLIENT_INTERNAL_SETUP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "common/config.h"
#include "common/dtype.h"
#include "rpc/channel.h"  // kMaxMessageBytes
#include "worker/client/offload_client.h"

namespace zo::client_internal {

// Room for a GradientPiece's fields other than its data (a job name is at
// most 128 bytes).
inline constexpr int64_t kPieceOverheadBytes = 1024;

// The dtype of every tensor of the job, and the config setting that decides
// it (for error messages).
std::pair<DType, const char*> JobDType(const Config& config);

// INVALID_ARGUMENT naming the option for options Open cannot work with.
absl::Status ValidateOptions(const ClientOptions& options, int64_t elem_bytes);

}  // namespace zo::client_internal

#endif  // ZO_WORKER_CLIENT_INTERNAL_SETUP_H_
