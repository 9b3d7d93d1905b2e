#include "worker/client/follow_job.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "rpc/error_detail.h"

namespace zo {
namespace {

// Whether another try may see the job arrive.
bool WorthWaiting(const absl::Status& why, const JobMove& move) {
  if (absl::IsNotFound(why) || absl::IsUnavailable(why)) return true;
  if (!absl::IsFailedPrecondition(why)) return false;
  if (ReasonOf(why) == v1::ErrorDetail::NEEDS_RESTORE) return false;  // nobody restores it
  // A stale "moved" answer from a new server still names this move; one
  // that names other servers is a move of its own.
  const std::optional<JobMove> again = ParseJobMove(why);
  return !again.has_value() || again->servers == move.servers;
}

}  // namespace

absl::Status CheckArrived(OffloadClient& client, const JobMove& move) {
  absl::StatusOr<v1::JobStatus> lead = client.JobStatus();
  if (!lead.ok()) return lead.status();
  // A server still without its part of the job.
  if (absl::Status state = client.CheckState(); !state.ok()) return state;
  if (!lead->needs_restore().empty()) {
    // A restore under way is waited for; a job nobody is restoring is not.
    if (lead->restoring()) {
      return absl::UnavailableError(absl::StrCat("restoring: ", lead->needs_restore()));
    }
    return WithDetail(absl::FailedPreconditionError(absl::StrCat(
                          "job ", move.job, " needs a restore: ", lead->needs_restore())),
                      MakeDetail(v1::ErrorDetail::NEEDS_RESTORE, move.job));
  }
  if (lead->version() < move.version) {
    return absl::UnavailableError(absl::StrCat("job ", move.job, " is at version ", lead->version(),
                                               " so far, not ", move.version));
  }
  return absl::OkStatus();
}

absl::Status FollowJob(const JobMove& move, absl::FunctionRef<absl::Status()> attach,
                       const FollowOptions& options) {
  // The bound is on time waited, not on the wall clock: a clock stepped
  // forward (NTP, a paused VM resumed) once ended a follow at its first
  // retry, "within 5m", half a minute in.
  const auto start = std::chrono::steady_clock::now();
  absl::Duration next_note = options.first_note;
  absl::Duration pause = absl::Milliseconds(50);
  for (;;) {
    const absl::Status why = attach();
    if (why.ok()) return why;
    if (!WorthWaiting(why, move)) return why;
    const absl::Duration waited = absl::FromChrono(std::chrono::steady_clock::now() - start);
    if (waited >= options.give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat("job ", move.job, " did not come up on ", absl::StrJoin(move.servers, ","),
                       " within ", absl::FormatDuration(options.give_up), ": ", why.message()));
    }
    if (options.retrying) options.retrying(waited, why);
    if (options.note && waited >= next_note) {
      options.note(waited, why);
      next_note = waited + options.note_every;
    }
    // Each try opens a connection to every server: back off to a second.
    absl::SleepFor(pause);
    pause = std::min(2 * pause, absl::Seconds(1));
  }
}

}  // namespace zo
