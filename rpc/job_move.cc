#include "rpc/job_move.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace zo {
namespace {

constexpr absl::string_view kJob = "job ";
constexpr absl::string_view kMoved = " moved to servers [";
constexpr absl::string_view kAt = "] at version ";

}  // namespace

absl::Status JobMovedError(const JobMove& move) {
  return absl::FailedPreconditionError(
      absl::StrCat(kJob, move.job, kMoved, absl::StrJoin(move.servers, ","), kAt, move.version));
}

std::optional<JobMove> ParseJobMove(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kFailedPrecondition) return std::nullopt;
  const absl::string_view m = status.message();
  const size_t moved = m.find(kMoved);
  if (moved == absl::string_view::npos) return std::nullopt;
  const size_t job_at = m.rfind(kJob, moved);
  const size_t at = m.find(kAt, moved);
  if (job_at == absl::string_view::npos || at == absl::string_view::npos) return std::nullopt;
  JobMove move;
  move.job = std::string(m.substr(job_at + kJob.size(), moved - job_at - kJob.size()));
  const absl::string_view list = m.substr(moved + kMoved.size(), at - moved - kMoved.size());
  move.servers = absl::StrSplit(list, ',', absl::SkipEmpty());
  absl::string_view version = m.substr(at + kAt.size());
  version = version.substr(0, version.find_first_not_of("0123456789"));
  if (move.job.empty() || move.servers.empty() || !absl::SimpleAtoi(version, &move.version)) {
    return std::nullopt;
  }
  return move;
}

}  // namespace zo
