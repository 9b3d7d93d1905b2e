#include "server/job_health.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "rpc/error_detail.h"

namespace zo {

JobHealth::JobHealth(std::string job, std::string lead,
                     std::function<void(const absl::Status&)> on_change)
    : job_(std::move(job)), lead_(std::move(lead)), on_change_(std::move(on_change)) {}

absl::Status JobHealth::NeedsRestore() const {
  // A restore in progress (UNAVAILABLE) passes: callers wait and retry. A
  // job that needs one does not until someone restores it.
  const std::string message = absl::StrCat("job ", job_, " needs restore: ", health_.message());
  if (health_.code() == absl::StatusCode::kUnavailable) return absl::UnavailableError(message);
  return WithDetail(absl::FailedPreconditionError(message),
                    MakeDetail(v1::ErrorDetail::NEEDS_RESTORE, job_));
}

void JobHealth::Set(absl::Status health) {
  health_ = std::move(health);
  on_change_(health_);
}

void JobHealth::Fail(absl::Status why) { Set(std::move(why)); }

void JobHealth::BeginRestore() {
  // Before the change wakes the pulls that wait: they wait again.
  restoring_ = true;
  ++restores_begun_;
  Set(absl::UnavailableError("a restore is in progress"));
}

void JobHealth::EndRestore(const absl::Status& loaded, const std::string& path,
                           bool healthy_after) {
  restoring_ = false;
  lead_restore_wait_ = LeadRestoreWait::kNone;
  if (!loaded.ok()) {
    Set(absl::DataLossError(absl::StrCat("restore from ", path, " failed: ", loaded.message())));
  } else if (healthy_after) {
    Set(absl::OkStatus());
  }
}

void JobHealth::LeadRestoreEnded(const absl::Status& result, const std::string& dir) {
  if (!result.ok()) {
    Set(absl::DataLossError(absl::StrCat("partial restore from ", dir, ": ", result.message())));
    return;
  }
  Set(absl::OkStatus());
  lost_ = false;
  ++restores_done_;
}

void JobHealth::RecoveringOwnPart(int64_t followers_version) {
  Set(absl::UnavailableError(absl::StrCat(
      "this lead restarted without its part of the job, which its followers hold at version ",
      followers_version, ": restoring the latest checkpoint")));
}

void JobHealth::OwnPartFailed(const absl::Status& why) {
  // Still refusing steps as RecoveringOwnPart left it (not stopped or lost).
  if (health_.code() == absl::StatusCode::kUnavailable) {
    Set(absl::FailedPreconditionError(why.message()));
  }
}

bool JobHealth::MarkLost(const std::string& what) {
  if (lost_) return false;
  lost_ = true;
  Set(absl::DataLossError(what));
  return true;
}

void JobHealth::AwaitLeadRestore() {
  lead_restore_wait_ = LeadRestoreWait::kOpenedByLead;
  Set(absl::UnavailableError(
      absl::StrCat("this server's part waits for the lead (", lead_, ") to restore it")));
}

bool JobHealth::AwaitingLeadRestore() const {
  return lead_restore_wait_.load() == LeadRestoreWait::kOpenedByLead;
}

void JobHealth::LeadLost(const absl::Status& answer) {
  if (!health_.ok()) return;
  lead_restore_wait_ = LeadRestoreWait::kLeadLostTheJob;
  ZO_LOG(WARNING) << "job " << job_ << ": the lead (" << lead_ << ") no longer holds the job ("
                  << answer.message() << "); waiting for it to roll the job back";
  Set(absl::UnavailableError(
      absl::StrCat("the lead (", lead_,
                   ") restarted without the job; waiting for it to roll the job back (a worker "
                   "that opens the job there starts that)")));
}

bool JobHealth::WaitsForLostLead() const {
  return lead_restore_wait_.load() == LeadRestoreWait::kLeadLostTheJob;
}

void JobHealth::LeadAnswered() {
  if (lead_restore_wait_ != LeadRestoreWait::kLeadLostTheJob) return;
  lead_restore_wait_ = LeadRestoreWait::kNone;
  if (health_.code() == absl::StatusCode::kUnavailable && !restoring_) Set(absl::OkStatus());
}

void JobHealth::AddTo(v1::JobStatus& status) const {
  if (!health_.ok()) {
    status.set_needs_restore(std::string(health_.message()));
    status.set_restoring(health_.code() == absl::StatusCode::kUnavailable);
  }
  status.set_restores(restores_done_);
}

}  // namespace zo
