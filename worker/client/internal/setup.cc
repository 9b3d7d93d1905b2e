#include "worker/client/internal/setup.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zo::client_internal {

namespace {

absl::Status ValidateJobName(const std::string& job) {
  const bool ok =
      !job.empty() && job.size() <= 128 && std::all_of(job.begin(), job.end(), [](char c) {
        return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
               c == '.' || c == '_' || c == '-';
      });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("job name '", job, "' must be 1 to 128 characters of [A-Za-z0-9._-]"));
}

}  // namespace

std::pair<DType, const char*> JobDType(const Config& config) {
  if (config.fp16.enabled) return {DType::kFloat16, "fp16.enabled is true"};
  if (config.bf16.enabled) return {DType::kBFloat16, "bf16.enabled is true"};
  return {DType::kFloat32, "neither fp16 nor bf16 is enabled"};
}

absl::Status ValidateOptions(const ClientOptions& options, int64_t elem_bytes) {
  ZO_RETURN_IF_ERROR(ValidateJobName(options.job));
  if (options.servers.empty() && options.channels.empty()) {
    return absl::InvalidArgumentError(
        "no servers: give ClientOptions::servers (zo.servers in the config) or channels");
  }
  if (!options.routes.empty() && options.routes.size() != options.channels.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("routes needs one in-process route per channel: got ", options.routes.size(),
                     " for ", options.channels.size(), " channels"));
  }
  if (options.dp_world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp_world_size must be >= 1, got ", options.dp_world_size));
  }
  if (options.dp_rank < 0 || options.dp_rank >= options.dp_world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp_rank ", options.dp_rank,
                     " is outside [0, dp_world_size = ", options.dp_world_size, ")"));
  }
  if (options.max_bytes_in_flight < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_bytes_in_flight must be >= 1, got ", options.max_bytes_in_flight));
  }
  if (options.max_piece_bytes < elem_bytes ||
      options.max_piece_bytes > kMaxMessageBytes - kPieceOverheadBytes) {
    return absl::InvalidArgumentError(absl::StrCat("max_piece_bytes must be in [", elem_bytes, ", ",
                                                   kMaxMessageBytes - kPieceOverheadBytes,
                                                   "], got ", options.max_piece_bytes));
  }
  if (options.call_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("call_timeout must be positive, got ",
                                                   absl::FormatDuration(options.call_timeout)));
  }
  if (options.retry_for < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("retry_for must not be negative, got ",
                                                   absl::FormatDuration(options.retry_for)));
  }
  return absl::OkStatus();
}

}  // namespace zo::client_internal
