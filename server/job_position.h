// Where a job stands on one server, and the calls that wait on it: the last
// version applied, the version an update is writing, the oldest version
// held, the restore generation, the job's health, whether it stopped, the
// steps' record (loss scales, last step) and the step clock.
//
// Every reader and writer of those goes through here: the step thread (it
// waits for work, begins and ends each update), the pulls (they wait for a
// version, open a cursor on it, register a fill), checkpoints and restores
// (they wait for a version, move the job back to another), and recovery
// (health). Each call keeps the invariants among the fields:
//
//   oldest_version <= base_version <= version
//   writing_version is -1, or version + 1 while an update writes it
//   waiters of a version wake once the job has it, begins writing it, needs
//     a restore, is restored, or stops
//
// A monitor: one mutex guards it all. A few calls run a caller's hook under
// that mutex, where a piece beside the position must change with it in one
// step (the pull fills as the update begins and ends, the coordinator as
// the version advances); hooks take only their own piece's lock, so the
// order is this mutex, then theirs. Wakes of waiting calls go to the
// WakeQueue, never run under the mutex.
#ifndef ZO_SERVER_JOB_POSITION_H_
#define ZO_SERVER_JOB_POSITION_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/wake_queue.h"
#include "offload/checkpoint/checkpoint_meta.h"
#include "proto/zo/v1/coordination.pb.h"
#include "proto/zo/v1/job.pb.h"
#include "server/job_health.h"
#include "server/state_checkpoint.h"
#include "server/step_clock.h"
#include "server/step_record.h"
#include "server/wait_list.h"

namespace zo {

class JobPosition {
 public:
  struct Options {
    std::string job;   // for messages
    std::string lead;  // the lead's address, for health messages
    double initial_loss_scale = 1.0;
    WakeQueue* wakes = nullptr;  // required
    // Under the mutex, on each health change while the job has not stopped:
    // OK (it is healthy: reopen what takes pushes) or the error calls get
    // meanwhile (JobHealth::NeedsRestore: close it with that).
    std::function<void(const absl::Status& health)> on_health;
  };
  explicit JobPosition(Options options);

  // ---------------------------------------------------------------- reading
  int64_t version() const;
  // The version the job was opened or last restored at (a caller of an
  // earlier instance of the job is told to resume there).
  int64_t base_version() const;
  double ScaleFor(int64_t version) const;
  // The oldest version held; the step record's checkpoint fields into `meta`.
  int64_t DescribeSteps(CheckpointMeta& meta) const;
  // The last step's length (StepClock::interval).
  absl::Duration step_interval() const;
  // JobStatus's version, open step, step, health, base version and
  // waiting-pull fields.
  void AddTo(v1::JobStatus& status) const;
  // OK while healthy, else why not (JobHealth::status).
  absl::Status health() const;
  // OK while the job is at `version` and healthy.
  absl::Status CheckAt(int64_t version) const;
  // OK while the job has taken no step (initial weights are accepted).
  absl::Status CheckUnstepped() const;
  // What a restore starts from.
  struct Restorable {
    int64_t restores_done = 0;
    int64_t version = 0;
    int64_t oldest_version = 0;
    int64_t generation = 0;
  };
  Restorable restorable() const;
  // Stopped, or lost for good: recovery has nothing left to do.
  bool gave_up() const;

  // ---------------------------------------------------------------- the step thread
  struct Work {
    enum class Kind { kStop, kCheckpoint, kStep, kSpeculate };
    Kind kind = Kind::kStop;
    int64_t version = 0;  // the last step applied; a step is version + 1
    int64_t generation = 0;
    int64_t oldest_version = 0;
    absl::Status health;  // OK, or what a checkpoint run now fails with
  };
  struct WorkTests {
    // A checkpoint is due at `version` (run before a step).
    std::function<bool(int64_t version, bool healthy)> checkpoint_due;
    // Every gradient of the open step is in (asked only while healthy).
    std::function<bool()> step_ready;
    // Some chunk's gradients are in for a speculative update to begin on
    // (asked only while healthy; may be unset).
    std::function<bool()> speculation_ready;
    // Every 2 s while nothing is due; runs without the mutex.
    std::function<void()> idle;
  };
  // Ends the last work's applying (StatusForAttach's waiters go on), then
  // waits until the job stops, a checkpoint is due, the open step is, or a
  // speculative update can go on (in that order of precedence).
  Work AwaitWork(const WorkTests& tests);
  // Something a WorkTests function reads changed: the step thread looks again.
  void Notify();
  // The open step's wait for its gradients counts from now (the job's
  // allocations are done).
  void OpenStepNow();
  // The step of `generation` was decided: false when a restore or a stop
  // came since (the step is dropped); else the job reads as applying until
  // the next AwaitWork.
  bool BeginApplying(int64_t generation);
  // Whether the job is still at `generation`: a restore changes it (under
  // the state lock) before it touches the state.
  bool AtGeneration(int64_t generation) const;
  // An update that pulls may follow (versions served from the master)
  // begins writing `step`, whose loss scale is `scale`: `under_mutex` runs
  // (the fills begin), then the step's waiters wake.
  void BeginWriting(int64_t step, double scale, const std::function<void()>& under_mutex);
  struct UpdateEnd {
    const v1::StepCommit* commit = nullptr;
    int64_t generation = 0;
    absl::Status applied;
    absl::Time ready;  // the step's gradients were all in
    absl::Time update_end;
  };
  struct UpdateEndHooks {
    // The update's fills end: `made` when the version became the job's.
    std::function<void(bool made)> fills_end;
    // The commit's step is the job's version (the coordinator moves on).
    std::function<void(int64_t step)> advanced;
  };
  // The update of `end.commit` ended. Its generation still the job's and
  // the update done: the step becomes the version (hooks.advanced), is
  // recorded, a commit carrying a failure fails the health; the fills end
  // and the version's waiters wake; returns the step's wait for its
  // gradients. Else nullopt: a failed update fails the health, and the
  // fills end unmade.
  std::optional<absl::Duration> EndUpdate(const UpdateEnd& end, const UpdateEndHooks& hooks);

  // ---------------------------------------------------------------- pulls
  // Without blocking: true when the job has `version`, or with
  // `while_written` when an update is writing it. Else `wake` is kept,
  // *ticket set and false returned (Job::AwaitVersion says when it wakes).
  absl::StatusOr<bool> AwaitVersion(int64_t version, std::function<void()> wake,
                                    WaitList::Ticket* ticket, bool while_written);
  // False when the wake was already posted.
  bool CancelVersionWait(WaitList::Ticket ticket);
  // Waits while an update writes `version`; FAILED_PRECONDITION when the
  // job does not have it after.
  absl::Status AwaitWritten(int64_t version);
  // A pull of `version` opens: its loss scale, and the restores begun (see
  // RestoredSince). UNAVAILABLE while a restore runs; FAILED_PRECONDITION
  // for a version the job does not have (or, `while_written`, is not writing).
  struct Opening {
    double loss_scale = 1.0;
    int64_t restores_begun = 0;
  };
  absl::StatusOr<Opening> OpenPull(int64_t version, bool while_written);
  // A restore runs, or one began after `restores_begun`.
  bool RestoredSince(int64_t restores_begun) const;
  // A pull's answer when a restore replaced the versions as it opened.
  absl::Status RestoredWhileOpening() const;
  // A pull of `version` may be filled by its update: it is the next version
  // or the one after (a worker whose pulls of the next are answered range
  // by range, server/pull_fills.h, starts pulling the one after before the
  // next is whole) and nothing is restoring or stopped.
  bool MayFill(int64_t version) const;
  // Under the mutex when a pull of `version` may be filled: `before`
  // (its update has not begun) or `during` (it writes `version`); 0, and
  // neither runs, otherwise.
  uint64_t RegisterFill(int64_t version, const std::function<uint64_t()>& before,
                        const std::function<uint64_t()>& during);
  // Waits, at most `max_wait`, until no decided step is being applied.
  void AwaitNotApplying(absl::Duration max_wait) const;
  // A checkpoint part in `generation` (FAILED_PRECONDITION for another)
  // of `version`: waits for the job to reach it (at most `deadline`), and
  // FAILED_PRECONDITION when it passed it or is unhealthy. Without
  // `version` (the part's finish, after steps went on) the generation only.
  absl::Status AwaitCheckpointVersion(int64_t generation, std::optional<int64_t> version,
                                      absl::Time deadline);

  // ---------------------------------------------------------------- health and restores
  // A restore of `generation` replaces this server's part.
  void BeginRestore(int64_t generation);
  // ... and ended (JobHealth::EndRestore) at `version`, keeping versions
  // from `oldest_version`; the steps' record is the checkpoint's. Every
  // waiting pull wakes to re-check.
  void EndRestore(const CheckpointMeta& meta, const LastStep& last, int64_t oldest_version,
                  const absl::Status& loaded, const std::string& path, bool healthy_after);
  // JobHealth's transitions (server/job_health.h), under the mutex.
  void LeadRestoreEnded(const absl::Status& result, const std::string& dir);
  void RecoveringOwnPart(int64_t followers_version);
  void OwnPartFailed(const absl::Status& why);
  // False, doing nothing, when already lost or stopped.
  bool MarkLost(const std::string& what);
  // Ignored when stopped or before the first step (the lead may not have
  // opened its part yet).
  void LeadLost(const absl::Status& answer);
  // Without the mutex unless the job waits for a lost lead.
  void LeadAnswered();
  void AwaitLeadRestore();
  bool AwaitingLeadRestore() const { return health_.AwaitingLeadRestore(); }

  // Stops for good: waiting calls wake and fail with the first `reason`
  // given, which is returned.
  absl::Status Stop(absl::Status reason);

  JobPosition(const JobPosition&) = delete;
  JobPosition& operator=(const JobPosition&) = delete;

 private:
  void HealthChangedLocked(const absl::Status& health);
  bool DueLocked(const WorkTests& tests) const;
  bool CheckpointDueLocked(const WorkTests& tests) const;

  const Options options_;

  mutable std::mutex mu_;
  // The step thread waits on it for work; StatusForAttach and checkpoints
  // for a version or the end of an update.
  mutable std::condition_variable cv_;
  // The last step applied; gradients come for the next (the open step).
  int64_t version_ = 0;
  // The version an update is writing, when pulls may read it meanwhile
  // (served from the master); -1 otherwise.
  int64_t writing_version_ = -1;
  int64_t base_version_ = 0;
  // The oldest version held: base_version_, or the one before it when the
  // restore brought the version a delayed parameter update computes on.
  int64_t oldest_version_ = 0;
  int64_t generation_ = 0;
  StepRecord steps_;
  JobHealth health_;
  bool stop_ = false;
  absl::Status stop_reason_;
  // The step thread has decided a step and not yet applied it.
  bool applying_ = false;
  // The open step's start and the last step's length.
  StepClock step_clock_{absl::Now()};
  // Pulls waiting for a version, keyed by it.
  WaitList version_waiters_;
};

}  // namespace zo

#endif  // ZO_SERVER_JOB_POSITION_H_
