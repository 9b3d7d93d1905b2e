// The lock over a job's optimizer state and accumulator as a whole: the
// step's statistics and update, a checkpoint part's capture, a restore
// (server/job.h). The step thread comes first: while it waits for or holds
// the lock, a checkpoint part's background capture stands back between its
// slices (std::mutex is not fair: a thread that relocks at once could
// otherwise keep a step waiting).
//
//   { JobStateLock::ForStep hold(lock); Apply(commit); }          // the step
//   if (std::unique_lock slice = lock.TryForSlice()) { ... }       // a capture
//   { std::lock_guard whole(lock.mutex()); ... }                   // the rest
//
// Thread-safe. Taken before the job's position (server/job_position.h).
#ifndef ZO_SERVER_JOB_STATE_LOCK_H_
#define ZO_SERVER_JOB_STATE_LOCK_H_

#include <atomic>
#include <mutex>

namespace zo {

class JobStateLock {
 public:
  // The step thread's hold, for its scope.
  class ForStep {
   public:
    explicit ForStep(JobStateLock& lock) : wants_(lock.step_wants_) {
      wants_.store(true);
      lock_ = std::unique_lock(lock.mu_);
    }
    ~ForStep() {
      lock_.unlock();
      wants_.store(false);
    }
    ForStep(const ForStep&) = delete;
    ForStep& operator=(const ForStep&) = delete;

   private:
    std::atomic<bool>& wants_;
    std::unique_lock<std::mutex> lock_;
  };

  // A background capture's slice: the lock, owned, when the step thread
  // neither wants nor holds it; otherwise not owned (wait a little and ask
  // again).
  std::unique_lock<std::mutex> TryForSlice() {
    std::unique_lock lock(mu_, std::defer_lock);
    if (!step_wants_.load()) (void)lock.try_lock();
    return lock;
  }

  // Everyone else: a plain lock.
  std::mutex& mutex() { return mu_; }

 private:
  std::mutex mu_;
  std::atomic<bool> step_wants_{false};
};

}  // namespace zo

#endif  // ZO_SERVER_JOB_STATE_LOCK_H_
