#include "server/job_position.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace zo {

JobPosition::JobPosition(Options options)
    : options_(std::move(options)),
      steps_(options_.initial_loss_scale),
      health_(options_.job, options_.lead,
              [this](const absl::Status& h) { HealthChangedLocked(h); }) {}

void JobPosition::HealthChangedLocked(const absl::Status& health) {
  if (stop_) return;  // closed for good
  if (!health.ok()) options_.wakes->Post(version_waiters_.TakeAll());
  if (options_.on_health) options_.on_health(health.ok() ? health : health_.NeedsRestore());
}

// ---------------------------------------------------------------- reading

int64_t JobPosition::version() const {
  std::lock_guard lock(mu_);
  return version_;
}

int64_t JobPosition::base_version() const {
  std::lock_guard lock(mu_);
  return base_version_;
}

double JobPosition::ScaleFor(int64_t version) const {
  std::lock_guard lock(mu_);
  return steps_.ScaleFor(version);
}

int64_t JobPosition::DescribeSteps(CheckpointMeta& meta) const {
  std::lock_guard lock(mu_);
  steps_.Describe(meta);
  return oldest_version_;
}

absl::Duration JobPosition::step_interval() const {
  std::lock_guard lock(mu_);
  return step_clock_.interval();
}

void JobPosition::AddTo(v1::JobStatus& status) const {
  std::lock_guard lock(mu_);
  status.set_version(version_);
  status.set_open_step(version_ + 1);
  steps_.AddTo(status, version_);
  health_.AddTo(status);
  status.set_base_version(oldest_version_);
  status.set_waiting_pulls(version_waiters_.size());
}

absl::Status JobPosition::health() const {
  std::lock_guard lock(mu_);
  return health_.status();
}

absl::Status JobPosition::CheckAt(int64_t version) const {
  std::lock_guard lock(mu_);
  if (version_ != version) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint of version ", version,
                                                      " but this server is at version ", version_));
  }
  return health_.status();
}

absl::Status JobPosition::CheckUnstepped() const {
  std::lock_guard lock(mu_);
  if (!health_.ok()) return health_.status();
  if (version_ != 0 || steps_.applied_steps() != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", options_.job, " is at version ", version_,
                     "; initial weights are accepted only at version 0"));
  }
  return absl::OkStatus();
}

JobPosition::Restorable JobPosition::restorable() const {
  std::lock_guard lock(mu_);
  return {.restores_done = health_.restores_done(),
          .version = version_,
          .oldest_version = oldest_version_,
          .generation = generation_};
}

bool JobPosition::gave_up() const {
  std::lock_guard lock(mu_);
  return stop_ || health_.lost();
}

// ---------------------------------------------------------------- the step thread

bool JobPosition::CheckpointDueLocked(const WorkTests& tests) const {
  return tests.checkpoint_due && tests.checkpoint_due(version_, health_.ok());
}

bool JobPosition::DueLocked(const WorkTests& tests) const {
  return stop_ || CheckpointDueLocked(tests) ||
         (health_.ok() &&
          (tests.step_ready() || (tests.speculation_ready && tests.speculation_ready())));
}

JobPosition::Work JobPosition::AwaitWork(const WorkTests& tests) {
  std::unique_lock lock(mu_);
  if (applying_) {
    applying_ = false;
    cv_.notify_all();
  }
  while (!cv_.wait_for(lock, std::chrono::seconds(2), [&] { return DueLocked(tests); })) {
    if (!tests.idle) continue;
    lock.unlock();
    tests.idle();
    lock.lock();
  }
  Work work{.version = version_,
            .generation = generation_,
            .oldest_version = oldest_version_,
            .health = health_.ok() ? absl::OkStatus() : health_.NeedsRestore()};
  if (stop_) {
    work.kind = Work::Kind::kStop;
  } else if (CheckpointDueLocked(tests)) {
    work.kind = Work::Kind::kCheckpoint;
  } else if (tests.step_ready()) {
    work.kind = Work::Kind::kStep;
  } else {
    work.kind = Work::Kind::kSpeculate;
  }
  return work;
}

void JobPosition::Notify() {
  // Under the mutex, so that a wait that just found nothing due cannot miss it.
  std::lock_guard lock(mu_);
  cv_.notify_all();
}

void JobPosition::OpenStepNow() {
  std::lock_guard lock(mu_);
  step_clock_.Reopen(absl::Now());
}

bool JobPosition::BeginApplying(int64_t generation) {
  std::lock_guard lock(mu_);
  if (stop_ || generation != generation_) return false;
  applying_ = true;
  return true;
}

bool JobPosition::AtGeneration(int64_t generation) const {
  std::lock_guard lock(mu_);
  return generation == generation_;
}

void JobPosition::BeginWriting(int64_t step, double scale,
                               const std::function<void()>& under_mutex) {
  std::lock_guard lock(mu_);
  steps_.SetScale(step, scale);
  writing_version_ = step;
  under_mutex();
  // A gRPC pull's wait finds the version not there yet and waits again; the
  // in-process route's reads follow the update.
  options_.wakes->Post(version_waiters_.TakeUpTo(writing_version_));
}

std::optional<absl::Duration> JobPosition::EndUpdate(const UpdateEnd& end,
                                                     const UpdateEndHooks& hooks) {
  const v1::StepCommit& commit = *end.commit;
  const int64_t step = commit.step();
  std::optional<absl::Duration> wait;
  {
    std::lock_guard lock(mu_);
    writing_version_ = -1;
    const bool made = end.generation == generation_ && end.applied.ok();
    if (made) {
      version_ = step;
      hooks.advanced(step);
      steps_.Record(commit);
      if (!commit.failure().empty()) {
        // Skipping on cannot help; a restore (after a config change) clears it.
        health_.Fail(absl::FailedPreconditionError(commit.failure()));
        ZO_LOG(ERROR) << commit.failure();
      }
      wait = step_clock_.Ended(end.ready, end.update_end);
    } else if (end.generation == generation_) {
      health_.Fail(end.applied);
      ZO_LOG(ERROR) << "job " << options_.job << ": step " << step
                    << " failed; the job needs restore from a checkpoint: " << end.applied;
    }
    // Pulls the update wrote are answered (or told it did not make the
    // version) before the version's waiters wake.
    hooks.fills_end(made);
    if (made) options_.wakes->Post(version_waiters_.TakeUpTo(version_));
  }
  cv_.notify_all();
  return wait;
}

// ---------------------------------------------------------------- pulls

absl::StatusOr<bool> JobPosition::AwaitVersion(int64_t version, std::function<void()> wake,
                                               WaitList::Ticket* ticket, bool while_written) {
  std::lock_guard lock(mu_);
  *ticket = WaitList::kNone;
  if (stop_) return stop_reason_;
  // Until a restore ends, versions the job has are being replaced (and
  // may be ones it will not have).
  if (health_.restoring()) {
    *ticket = version_waiters_.Add(version, std::move(wake));
    return false;
  }
  if (version_ >= version || (while_written && writing_version_ == version)) return true;
  if (!health_.ok()) {
    const absl::Status why = health_.NeedsRestore();
    return absl::Status(why.code(),
                        absl::StrCat("version ", version, " will not come yet: ", why.message()));
  }
  *ticket = version_waiters_.Add(version, std::move(wake));
  return false;
}

bool JobPosition::CancelVersionWait(WaitList::Ticket ticket) {
  std::lock_guard lock(mu_);
  return version_waiters_.Remove(ticket);
}

absl::Status JobPosition::AwaitWritten(int64_t version) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return writing_version_ != version || stop_; });
  if (version_ >= version) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("version ", version, " of job ", options_.job,
                   " was read as its update wrote it, but the update did not end it (the job is "
                   "at version ",
                   version_, "): pull again"));
}

absl::StatusOr<JobPosition::Opening> JobPosition::OpenPull(int64_t version, bool while_written) {
  std::lock_guard lock(mu_);
  if (health_.restoring()) return RestoredWhileOpening();
  if (version_ < version && !(while_written && writing_version_ == version)) {
    return absl::FailedPreconditionError(
        absl::StrCat("version ", version, " of job ", options_.job, " does not exist yet"));
  }
  return Opening{.loss_scale = steps_.ScaleFor(version),
                 .restores_begun = health_.restores_begun()};
}

bool JobPosition::RestoredSince(int64_t restores_begun) const {
  std::lock_guard lock(mu_);
  return health_.restoring() || health_.restores_begun() != restores_begun;
}

absl::Status JobPosition::RestoredWhileOpening() const {
  // UNAVAILABLE: the client asks again, and then waits for the restore.
  return absl::UnavailableError(
      absl::StrCat("job ", options_.job, " was being restored while this pull opened; pull again"));
}

bool JobPosition::MayFill(int64_t version) const {
  std::lock_guard lock(mu_);
  return !health_.restoring() && !stop_ && (version == version_ + 1 || version == version_ + 2);
}

uint64_t JobPosition::RegisterFill(int64_t version, const std::function<uint64_t()>& before,
                                   const std::function<uint64_t()>& during) {
  std::lock_guard lock(mu_);  // BeginWriting's hook runs under it too
  if (health_.restoring() || stop_) return 0;
  if (version == writing_version_) return during();
  // Pulls of a version are answered range by range (server/pull_fills.h):
  // their worker may register for the one after before it is whole.
  if (version == version_ + 1 || version == version_ + 2) return before();
  return 0;
}

void JobPosition::AwaitNotApplying(absl::Duration max_wait) const {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, absl::ToChronoNanoseconds(max_wait), [&] { return !applying_ || stop_; });
}

absl::Status JobPosition::AwaitCheckpointVersion(int64_t generation, std::optional<int64_t> wanted,
                                                 absl::Time deadline) {
  std::unique_lock lock(mu_);
  if (generation != generation_) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint of generation ", generation,
                                                      " but this server is at generation ",
                                                      generation_));
  }
  if (!wanted.has_value()) return absl::OkStatus();
  const int64_t version = *wanted;
  while (!stop_ && version_ < version) {
    if (cv_.wait_until(lock, absl::ToChronoTime(deadline)) == std::cv_status::timeout) {
      return absl::DeadlineExceededError(
          absl::StrCat("version ", version, " not reached before the deadline"));
    }
  }
  if (version_ != version) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint of version ", version,
                                                      " but this server is at version ", version_));
  }
  return health_.status();
}

// ---------------------------------------------------------------- health and restores

void JobPosition::BeginRestore(int64_t generation) {
  {
    std::lock_guard lock(mu_);
    generation_ = generation;
    health_.BeginRestore();
  }
  cv_.notify_all();
}

void JobPosition::EndRestore(const CheckpointMeta& meta, const LastStep& last,
                             int64_t oldest_version, const absl::Status& loaded,
                             const std::string& path, bool healthy_after) {
  {
    std::lock_guard lock(mu_);
    version_ = meta.version;
    base_version_ = meta.version;
    oldest_version_ = oldest_version;
    steps_.Restore(meta, last, /*keeps_previous=*/oldest_version_ < meta.version);
    // Pulls that waited re-check their instance (and hear of the restore).
    options_.wakes->Post(version_waiters_.TakeAll());
    health_.EndRestore(loaded, path, healthy_after);
    step_clock_.Reopen(absl::Now());
  }
  cv_.notify_all();
}

void JobPosition::LeadRestoreEnded(const absl::Status& result, const std::string& dir) {
  {
    std::lock_guard lock(mu_);
    health_.LeadRestoreEnded(result, dir);
    step_clock_.Reopen(absl::Now());
  }
  cv_.notify_all();
}

void JobPosition::RecoveringOwnPart(int64_t followers_version) {
  std::lock_guard lock(mu_);
  health_.RecoveringOwnPart(followers_version);
}

void JobPosition::OwnPartFailed(const absl::Status& why) {
  std::lock_guard lock(mu_);
  health_.OwnPartFailed(why);
}

bool JobPosition::MarkLost(const std::string& what) {
  std::lock_guard lock(mu_);
  return !stop_ && health_.MarkLost(what);  // false when already lost
}

void JobPosition::LeadLost(const absl::Status& answer) {
  std::lock_guard lock(mu_);
  if (stop_ || version_ == 0) return;
  health_.LeadLost(answer);
}

void JobPosition::LeadAnswered() {
  // Every report of every step comes here: no lock unless there is news.
  if (!health_.WaitsForLostLead()) return;
  std::lock_guard lock(mu_);
  health_.LeadAnswered();
}

void JobPosition::AwaitLeadRestore() {
  std::lock_guard lock(mu_);
  health_.AwaitLeadRestore();
}

absl::Status JobPosition::Stop(absl::Status reason) {
  absl::Status first;
  {
    std::lock_guard lock(mu_);
    if (!stop_) stop_reason_ = std::move(reason);
    stop_ = true;
    options_.wakes->Post(version_waiters_.TakeAll());
    first = stop_reason_;
  }
  cv_.notify_all();
  return first;
}

}  // namespace zo
