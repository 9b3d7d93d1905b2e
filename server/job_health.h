// A job's health on one server (docs/architecture.md, "Recovery"): whether
// it takes steps and, when not, why, in the form callers act on:
//
//   healthy                     steps, pushes and pulls proceed
//   restoring (UNAVAILABLE)     a restore is under way, or about to be (the
//                               lead restarted, a follower waits for its
//                               lead): callers wait and ask again
//   needs restore               nobody is restoring it (a step failed, a
//     (FAILED_PRECONDITION,     restore failed half-way, a server lost its
//      NEEDS_RESTORE; DATA_LOSS part with no checkpoint): callers are told,
//      when lost)               and an operator restores it
//
// and the transitions between them: restores begun and ended (counted:
// JobStatus.restores), the job marked lost for good, and a follower's wait
// for its lead's restore (opened by the lead, or its lead lost the job).
//
// Not thread-safe on its own: JobPosition guards it with its mutex, since
// health is read with the job's version on every call's path. Only
// AwaitingLeadRestore and WaitsForLostLead read without it.
#ifndef ZO_SERVER_JOB_HEALTH_H_
#define ZO_SERVER_JOB_HEALTH_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "proto/zo/v1/job.pb.h"

namespace zo {

class JobHealth {
 public:
  // `on_change(health)` runs on every change, under JobPosition's mutex: the job
  // closes its accumulator and wakes the pulls that wait, or reopens it.
  // `lead`: the lead server's address, for messages.
  JobHealth(std::string job, std::string lead, std::function<void(const absl::Status&)> on_change);

  bool ok() const { return health_.ok(); }
  // OK, or why the job takes no steps (JobStatus.needs_restore).
  const absl::Status& status() const { return health_; }
  // The error calls get while !ok(): UNAVAILABLE while a restore is under
  // way (callers wait and retry), FAILED_PRECONDITION with the NEEDS_RESTORE
  // reason while the job waits for one.
  absl::Status NeedsRestore() const;
  // A restore is replacing the state and versions: pulls wait for it.
  bool restoring() const { return restoring_; }
  // Restores begun (tells a pull whether one began while it opened).
  int64_t restores_begun() const { return restores_begun_; }
  // The job was marked lost (no checkpoint brings it back).
  bool lost() const { return lost_; }

  // A step or the config failed: the job needs a restore, saying `why`.
  void Fail(absl::Status why);

  // This server's part is being replaced from a checkpoint.
  void BeginRestore();
  // ... and was replaced: `loaded` says how loading from `path` went (a
  // failure leaves the job needing a restore). With `healthy_after` false
  // (the lead, whose followers restore next) it still reads as restoring
  // until LeadRestoreEnded.
  void EndRestore(const absl::Status& loaded, const std::string& path, bool healthy_after);
  // The lead's restore of every server from `dir` ended with `result`: a
  // success counts (JobStatus.restores) and clears a loss.
  void LeadRestoreEnded(const absl::Status& result, const std::string& dir);
  // Restores the lead finished.
  int64_t restores_done() const { return restores_done_; }

  // Lead: it restarted without its part, which its followers hold at
  // `followers_version`; its recovery restores it (or OwnPartFailed).
  void RecoveringOwnPart(int64_t followers_version);
  // ... and that recovery failed: still refusing steps, now needing a
  // restore by hand, saying `why`.
  void OwnPartFailed(const absl::Status& why);
  // Lead: a server lost its part with no checkpoint to bring it back: the
  // job fails for good with `what` (health DATA_LOSS). False when already
  // lost.
  bool MarkLost(const std::string& what);

  // Follower: its lead opened this part to restore it (OpenJobRequest.
  // by_lead): it refuses steps, and its server refuses workers' opens,
  // until the restore reaches it.
  void AwaitLeadRestore();
  bool AwaitingLeadRestore() const;
  // Follower: the lead answered `answer` (NO_JOB): it restarted empty, and
  // the version the workers wait for will not come. Refuses steps until the
  // lead's restore reaches here, or the lead takes a report after all.
  void LeadLost(const absl::Status& answer);
  bool WaitsForLostLead() const;
  // The lead took a report: healthy again, if only the lost lead was why.
  void LeadAnswered();

  // JobStatus's health fields: needs_restore, restoring, restores.
  void AddTo(v1::JobStatus& status) const;

  JobHealth(const JobHealth&) = delete;
  JobHealth& operator=(const JobHealth&) = delete;

 private:
  void Set(absl::Status health);

  const std::string job_;
  const std::string lead_;
  const std::function<void(const absl::Status&)> on_change_;

  absl::Status health_;
  bool restoring_ = false;
  int64_t restores_begun_ = 0;
  int64_t restores_done_ = 0;
  bool lost_ = false;
  // Follower: why this part waits for the lead's restore (EndRestore ends
  // either). Written under JobPosition's mutex; read without it where a step
  // would pay for the lock.
  enum class LeadRestoreWait {
    kNone,
    kOpenedByLead,    // AwaitLeadRestore: workers' opens are refused
    kLeadLostTheJob,  // LeadLost: a report the lead takes ends it too
  };
  std::atomic<LeadRestoreWait> lead_restore_wait_ = LeadRestoreWait::kNone;
};

}  // namespace zo

#endif  // ZO_SERVER_JOB_HEALTH_H_
