// The lead's restore of its job across the servers (docs/architecture.md,
// "Checkpoints" and "Recovery"): a committed checkpoint checked against the
// job, a fresh generation, the lead's own part restored first, then every
// follower's (a follower that restarted without the job gets its part
// opened again first), then the step decider as the checkpoint left it.
// One restore at a time: a second waits for the first, and with
// `if_restores` sees that it already happened.
//
// It acts on its job only through RestoreActions and holds none of the
// job's locks while it calls them; the job calls Run holding none of its
// own (it blocks on calls to the followers). Thread-safe.
#ifndef ZO_SERVER_LEAD_RESTORE_H_
#define ZO_SERVER_LEAD_RESTORE_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "offload/checkpoint/checkpoint_dir.h"
#include "proto/zo/v1/checkpoint.pb.h"
#include "server/job_spec.h"
#include "server/peer_client.h"

namespace zo {

// Where the job stands, as a restore needs to know it.
struct RestorePosition {
  int64_t restores_done = 0;  // JobHealth::restores_done
  int64_t version = 0;
  int64_t base_version = 0;  // the oldest version held (JobStatus.base_version)
  int64_t generation = 0;
};

// What the restore asks of its job.
struct RestoreActions {
  std::function<RestorePosition()> position;
  // The lead's own part from `request`; the job stays restoring (its
  // followers restore next) until `ended`.
  std::function<absl::Status(const v1::RestorePartRequest& request)> restore_own_part;
  // The step decider (applied steps, loss scaler) as `meta` left it.
  std::function<absl::Status(const CheckpointMeta& meta)> restore_decider;
  // The restore of checkpoint `dir` ended with `status`: healthy on OK,
  // needing a restore otherwise.
  std::function<void(const absl::Status& status, const std::string& dir)> ended;
};

class LeadRestore {
 public:
  struct Options {
    const JobSpec* spec = nullptr;  // the lead's; outlives this
    PeerClient* peers = nullptr;
    // Each follower's RestorePart gets ten times this.
    absl::Duration peer_timeout = absl::Seconds(30);
    std::string root;  // where checkpoints are; empty: none here
  };

  LeadRestore(Options options, RestoreActions actions);

  // Every server restored from the committed checkpoint at `path` (empty:
  // the latest under the root). `rollback`: RestoreRequest.rollback (a new
  // instance of the job). `if_restores`: only while that many restores have
  // finished; otherwise nothing happens and the answer says
  // already_restored. A checkpoint of another manifest is refused before
  // any server is touched.
  absl::StatusOr<v1::RestoreResponse> Run(const std::string& path, bool rollback,
                                          std::optional<int64_t> if_restores);

  // The latest committed checkpoint of the job under the root (NOT_FOUND:
  // none, or no root).
  absl::StatusOr<std::string> Latest() const;

  LeadRestore(const LeadRestore&) = delete;
  LeadRestore& operator=(const LeadRestore&) = delete;

 private:
  // The followers' parts, in server order, after the lead's.
  absl::Status RestoreFollowers(const v1::RestorePartRequest& request);
  // Opens the job's part on follower `server` (OpenJobRequest.by_lead).
  absl::Status OpenPartOn(int server);

  const Options options_;
  const JobSpec& spec_;
  const RestoreActions actions_;
  // Held for the whole of Run.
  std::mutex mu_;
};

}  // namespace zo

#endif  // ZO_SERVER_LEAD_RESTORE_H_
