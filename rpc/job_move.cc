#include "rpc/job_move.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/zo/v1/error.pb.h"
#include "rpc/error_detail.h"

namespace zo {

absl::Status JobMovedError(const JobMove& move) {
  v1::ErrorDetail detail = MakeDetail(v1::ErrorDetail::JOB_MOVED, move.job, move.version);
  for (const std::string& s : move.servers) detail.add_servers(s);
  return WithDetail(absl::FailedPreconditionError(absl::StrCat(
                        "job ", move.job, " moved to servers [", absl::StrJoin(move.servers, ","),
                        "] at version ", move.version)),
                    detail);
}

std::optional<JobMove> ParseJobMove(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kFailedPrecondition) return std::nullopt;
  const std::optional<v1::ErrorDetail> detail = DetailOf(status);
  if (!detail.has_value() || detail->reason() != v1::ErrorDetail::JOB_MOVED ||
      detail->job().empty() || detail->servers().empty()) {
    return std::nullopt;
  }
  return JobMove{.job = detail->job(),
                 .servers = {detail->servers().begin(), detail->servers().end()},
                 .version = detail->version()};
}

}  // namespace zo
