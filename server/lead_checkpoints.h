// The lead's checkpoints of its job (docs/architecture.md, "Checkpoints"):
// requests waiting for their version, the round that writes one across the
// servers (BEGIN on every server between steps, FINISH while the steps go
// on, then the commit record and the pruning of old ones), what JobStatus
// shows of them, and the freeze that holds a job still for a move.
//
// It acts on its job only through CheckpointActions (this server's own part,
// the job's side of the commit record, waking the step loop), and takes
// none of the job's locks itself; the job may call Due and frozen holding
// its position's mutex (which then comes first).
// Thread-safe.
#ifndef ZO_SERVER_LEAD_CHECKPOINTS_H_
#define ZO_SERVER_LEAD_CHECKPOINTS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "offload/checkpoint/checkpoint_dir.h"
#include "proto/zo/v1/checkpoint.pb.h"
#include "proto/zo/v1/job.pb.h"
#include "server/peer_client.h"

namespace zo {

// What the checkpoints ask of their job.
struct CheckpointActions {
  // The commit record's fields as of `version`, which the job is at (all but
  // `version` and `parts`); returns the bytes per element each part carries
  // of the weights of version - 1 (0: none).
  std::function<uint32_t(int64_t version, CheckpointMeta& meta)> describe;
  // This server's part: its snapshot taken at `version` into `dir`, then
  // finished (written while steps go on).
  std::function<absl::Status(int64_t version, const std::string& dir, uint32_t previous_bytes)>
      begin_own_part;
  std::function<absl::StatusOr<v1::WriteCheckpointPartResponse>(int64_t version,
                                                                const std::string& dir)>
      finish_own_part;
  // Fails and forgets this server's part in progress (a follower could not
  // begin its own).
  std::function<void(const absl::Status& why)> drop_own_part;
  // The step loop has something to look at: a request came, a checkpoint
  // ended, the freeze was lifted. Called holding none of this class's locks.
  std::function<void()> wake;
  // What follower `server` answered to its part's call (begin or finish):
  // the lead's recovery hears it, so a follower that restarted without the
  // job (NO_JOB) is rolled back now, not at the next probe. Called holding
  // none of this class's locks.
  std::function<void(int server, const absl::Status& answer)> heard;
};

class LeadCheckpoints {
 public:
  struct Options {
    std::string job;
    std::vector<std::string> servers;  // the lead first
    PeerClient* peers = nullptr;       // for followers' parts
    // Deadline of each follower's part call is ten times this.
    absl::Duration peer_timeout = absl::Seconds(30);
    std::string root;  // where checkpoints go; empty: refused
    int keep = 0;      // committed ones kept after each; 0: all
  };

  LeadCheckpoints(Options options, CheckpointActions actions);
  ~LeadCheckpoints();  // Stop(), Join()

  // The Checkpoint RPC: waits (until `deadline`) for a checkpoint of a
  // version >= `min_version`, which the step loop runs between steps.
  // `freeze`: once committed, no further step until Thaw (a move's first
  // half). DEADLINE_EXCEEDED leaves the request to be committed later.
  absl::StatusOr<v1::CheckpointResponse> Request(int64_t min_version, absl::Time deadline,
                                                 bool freeze = false);
  // A request is due for a job at `version` (any, when the job is not
  // `healthy`: it fails at once), and no checkpoint is being finished.
  bool Due(int64_t version, bool healthy) const;
  // The step loop, between steps, holding none of the job's locks: answers
  // the requests due at `version`. With `health` not OK they fail with it;
  // otherwise every server's part is begun here, and finished on a thread
  // of this class while the steps go on (here, with a freeze).
  void Run(int64_t version, int64_t generation, const absl::Status& health);

  // A freeze is holding the job at its version.
  bool frozen() const;
  // Lifts a freeze; false when there was none.
  bool Thaw();

  // Fails every waiting request with `why(its min_version)` (a restore
  // undid the versions they wait for).
  void FailWaiting(const std::function<absl::Status(int64_t min_version)>& why);
  // Refuses further requests and fails the waiting ones (the job stops).
  void Stop();
  // Waits for a checkpoint being finished (not from its own thread).
  void Join();

  // The job was restored from the checkpoint of `version`.
  void Restored(int64_t version);
  // JobStatus's checkpoint fields: last step, last failure, failures, frozen.
  void AddTo(v1::JobStatus& status) const;
  // Requests waiting, and whether one is being finished: for tests.
  size_t waiting() const;
  bool running() const;

  LeadCheckpoints(const LeadCheckpoints&) = delete;
  LeadCheckpoints& operator=(const LeadCheckpoints&) = delete;

 private:
  struct Pending {
    int64_t min_version = 0;
    bool freeze = false;
    std::promise<absl::StatusOr<v1::CheckpointResponse>> done;
  };
  using Requests = std::deque<std::shared_ptr<Pending>>;
  struct Started {
    int64_t version = 0;
    int64_t generation = 0;
    std::string dir;
    CheckpointMeta meta;
    absl::Time start;
  };

  // The checkpoint directory, the commit record as of `version`, and every
  // server's part begun (BEGIN).
  absl::StatusOr<Started> Start(int64_t version, int64_t generation);
  // Every part finished (FINISH), the commit and the pruning; a failure
  // removes the temporary directory.
  absl::StatusOr<v1::CheckpointResponse> Finish(const Started& started);
  absl::StatusOr<v1::CheckpointResponse> CommitParts(const Started& started);
  // Records how the checkpoint of `version` ended (a failure is logged,
  // counted and kept for JobStatus until one succeeds) and answers
  // `requests`. Requires mu_.
  void DoneLocked(int64_t version, const absl::StatusOr<v1::CheckpointResponse>& result,
                  Requests& requests);

  const Options options_;
  const CheckpointActions actions_;

  mutable std::mutex mu_;
  Requests waiting_;
  bool running_ = false;  // thread_ finishes one
  bool stopped_ = false;
  bool frozen_ = false;
  int64_t last_step_ = -1;
  // The last attempt's failure ("step N: why"), empty once one succeeds;
  // and the failures so far.
  std::string last_error_;
  int64_t failures_ = 0;
  // Finishes a begun checkpoint; started and joined by Run (the step loop),
  // joined by Join once the step loop has ended.
  std::thread thread_;
};

}  // namespace zo

#endif  // ZO_SERVER_LEAD_CHECKPOINTS_H_
