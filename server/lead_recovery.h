// The lead's watch over the servers of its job (docs/architecture.md,
// "Recovery"): what each follower answered last (FollowerHealth), and,
// when a server restarted without its part of the job (a follower, or the
// lead itself), every server rolled back to the latest checkpoint on a
// thread of its own; with no checkpoint, the job failed for good. One
// recovery at a time; after a failed one, the next waits 10 s.
//
// It acts on its job only through RecoveryActions, so it holds none of the
// job's locks; the job calls it without holding its own (Heard and Probe
// block on calls to other servers or on a finished recovery's thread).
// Thread-safe.
#ifndef ZO_SERVER_LEAD_RECOVERY_H_
#define ZO_SERVER_LEAD_RECOVERY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/zo/v1/checkpoint.pb.h"
#include "server/follower_health.h"

namespace zo {

// What the recovery asks of its job.
struct RecoveryActions {
  // What follower `server` answers about the job now (a status probe).
  std::function<absl::Status(int server)> ask;
  // Every server rolled back to the checkpoint at `path` (a restore with
  // rollback, which opens the part again on a follower without it).
  std::function<absl::StatusOr<v1::RestoreResponse>(const std::string& path)> roll_back;
  // The latest committed checkpoint of the job (NOT_FOUND: none).
  std::function<absl::StatusOr<std::string>()> latest_checkpoint;
  // The job's version now.
  std::function<int64_t()> version;
  // Fails the job for good: `what_happened` and `why` no checkpoint can
  // bring it back.
  std::function<void(const std::string& what_happened, const absl::Status& why)> mark_lost;
  // True once the job stopped or was marked lost: nothing to recover.
  std::function<bool()> gave_up;
  // A recovery of the lead's own part failed: the job, refusing steps
  // since it restarted, is left needing a restore by hand, saying `why`.
  std::function<void(const absl::Status& why)> own_part_failed;
};

class LeadRecovery {
 public:
  // `servers`: the job's, the lead first; `job`: its name, for log lines.
  LeadRecovery(std::string job, std::vector<std::string> servers, RecoveryActions actions);
  ~LeadRecovery();  // Join()

  // Follower `server` answered `answer` (a commit, a probe): recorded, and a
  // NO_JOB answer (it restarted and lost its part) starts a recovery.
  void Heard(int server, const absl::Status& answer);
  // Asks follower `server` (ask) and hears its answer; Probe: every one.
  void ProbeOne(int server) { Heard(server, actions_.ask(server)); }
  void Probe();
  // This lead restarted without its part, which its followers hold at
  // `followers_version`: a recovery starts at once.
  void RecoverOwnPart(int64_t followers_version);

  // What each follower answered last.
  const FollowerHealth& followers() const { return followers_; }
  // Waits for a recovery under way to end (not from its own thread).
  void Join();

  LeadRecovery(const LeadRecovery&) = delete;
  LeadRecovery& operator=(const LeadRecovery&) = delete;

 private:
  // Starts `work` on the recovery thread; requires mu_.
  void StartLocked(std::function<void()> work);
  // Rolls every server back to the latest checkpoint after `what_happened`
  // (`after`: the same, short, for the log line), or marks the job lost
  // when there is none. False when the rollback (or listing the
  // checkpoints) failed: `failure` says why.
  bool RollBack(const std::string& what_happened, const std::string& after, absl::Status* failure);

  const std::string job_;
  const std::vector<std::string> servers_;
  const RecoveryActions actions_;
  FollowerHealth followers_;

  std::mutex mu_;
  std::thread thread_;  // guarded by mu_
  // After a failed recovery, none starts before this (Unix ns; set on the
  // recovery thread, which must not take mu_: StartLocked joins it under
  // mu_); a loss after a successful one is recovered at once.
  std::atomic<int64_t> retry_after_ns_{0};
  std::atomic<bool> running_{false};
};

}  // namespace zo

#endif  // ZO_SERVER_LEAD_RECOVERY_H_
