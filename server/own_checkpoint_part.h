// This server's part of its job's checkpoints (docs/architecture.md,
// "Checkpoints"): a StateSnapshot begun at the version the job is at, then
// captured and written while the steps go on (the lead's round, BEGIN then
// FINISH, or a follower's WriteCheckpointPart), and the staging buffers the
// step's hook copies into, kept from one checkpoint to the next.
//
//   { std::lock_guard l(state_lock.mutex()); part.BeginLocked(v, dir, 0, versions); }
//   ... steps go on: BeforeUpdateLocked(), then AdamStep(..., ObserverLocked()) ...
//   ZO_ASSIGN_OR_RETURN(auto written, part.Finish(v, dir, nvme_wait));  // another thread
//
// It shares the job's JobStateLock: BeginLocked, DropLocked and the step's
// hooks run holding it; Finish takes it a slice at a time and stands back
// while the step thread wants it. It takes no other lock of the job's.
// Thread-safe under that rule.
#ifndef ZO_SERVER_OWN_CHECKPOINT_PART_H_
#define ZO_SERVER_OWN_CHECKPOINT_PART_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/sharding.h"
#include "offload/tier/tiered_state.h"
#include "proto/zo/v1/checkpoint.pb.h"
#include "server/gradient_accumulator.h"
#include "server/job_state_lock.h"
#include "server/param_versions.h"
#include "server/snapshot_staging.h"
#include "server/state_snapshot.h"

namespace zo {

class OwnCheckpointPart {
 public:
  // What the step's hook may hold in copies for the background writer by
  // default (kept across checkpoints, at most what was used).
  static constexpr int64_t kDefaultStagingBytes = int64_t{1} << 30;

  struct Options {
    std::string job;  // for messages
    int server_index = 0;
    DType dtype = DType::kFloat16;  // of the job's served versions
    int64_t staging_bytes = kDefaultStagingBytes;
  };
  // `chunks` (this server's, local offsets ascending from 0), `map` and
  // `state` outlive the part.
  OwnCheckpointPart(Options options, const ShardMap& map, std::vector<LocalChunk> chunks,
                    TieredOptimizerState& state, JobStateLock& lock);

  // Requires the state lock, with the job at `version`. Fails a part left
  // unfinished (its lead failed or died), then begins this one in `dir`;
  // with `previous_bytes` (the job's element size), the part carries the
  // weights of version - 1 too, leased from `versions` until written.
  absl::Status BeginLocked(int64_t version, const std::string& dir, uint32_t previous_bytes,
                           ParamVersions& versions);
  // Captures and writes the part begun at `version` in `dir`: RAM a slice at
  // a time (a step waits for one slice at most), NVMe by the steps that
  // come within `nvme_wait` or else one observe pass. FAILED_PRECONDITION
  // when no such part is under way (a restore or a later checkpoint ended
  // it). Takes the state lock itself: call it holding none.
  absl::StatusOr<v1::WriteCheckpointPartResponse> Finish(int64_t version, const std::string& dir,
                                                         absl::Duration nvme_wait);
  // Requires the state lock: fails and forgets the part under way, if any.
  void DropLocked(const absl::Status& why);

  // The update's hooks, holding the state lock (the step thread's). Before
  // it begins: a part carrying the version the update overwrites writes it
  // first (the background writer may have already).
  void BeforeUpdateLocked();
  // For TieredOptimizerState::AdamStep: takes each tile as it was before the
  // step while a part is under way; empty otherwise.
  StateObserver ObserverLocked() const;

  // Bytes the staging buffers hold now (JobStatus.ram_bytes).
  int64_t staging_held_bytes() const { return staging_->held_bytes(); }

  OwnCheckpointPart(const OwnCheckpointPart&) = delete;
  OwnCheckpointPart& operator=(const OwnCheckpointPart&) = delete;

 private:
  std::string PathIn(const std::string& dir) const;
  absl::Status Capture(StateSnapshot& snapshot, absl::Duration nvme_wait);

  const Options options_;
  const ShardMap& map_;
  const std::vector<LocalChunk> chunks_;
  TieredOptimizerState& state_;
  JobStateLock& lock_;
  const std::shared_ptr<SnapshotStaging> staging_;
  // The part under way. Guarded by lock_.
  std::shared_ptr<StateSnapshot> snapshot_;
};

}  // namespace zo

#endif  // ZO_SERVER_OWN_CHECKPOINT_PART_H_
