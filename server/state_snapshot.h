// One server's checkpoint part taken at one version while the job keeps
// stepping (docs/architecture.md, "Checkpoints"). Nothing is copied when the
// snapshot begins; each range of the optimizer state is written to the part
// file (ScatteredPartWriter, so into the page cache) the first time one of
// these happens to it:
//
//   - a step is about to update it: the step's hook (TieredOptimizerState's
//     before_update) copies the range as it still is into a staging buffer
//     (server/snapshot_staging.h), tile by tile on the pool's workers (NVMe
//     tiles straight from the pipeline's buffer), which the background
//     writer then writes (neighbouring copies as one run, straight to the
//     disk where the filesystem allows: no page-cache copy, no writeback
//     competing with the steps later); with no buffer free, the hook
//     writes itself;
//   - the background writer reaches it between steps (RAM ranges, a slice
//     at a time, holding the state still for one slice);
//   - nothing else did: the rest goes through one observe pass
//     (TieredOptimizerState::ObserveNvme), the NVMe state's only extra read.
//
// So the snapshot holds the state of `version` exactly whatever steps run
// meanwhile, and no step waits longer than one slice or its own hook.
//
// With a delayed parameter update the part also carries the 16-bit weights
// of the version before `version` (offload/checkpoint/design.md). The
// snapshot holds a lease on them, which keeps the next update from
// overwriting them; CapturePrevious writes them all and lets the lease go.
// The background writer calls it first, and the next update calls it
// before it begins, whichever comes first.
//
//   ZO_ASSIGN_OR_RETURN(auto snap, StateSnapshot::Begin(path, chunks, map, version));
//   state->AdamStep(c, grad, lp, nullptr, snap->observer());   // steps go on
//   ... snap->CaptureSomeFromRam(*state, 1 << 20) between steps ...
//   ZO_ASSIGN_OR_RETURN(CheckpointPartSummary summary, snap->Finish());
//
// Thread-safe. The Capture* calls that read `state` need the caller to keep
// it from being stepped meanwhile (Job holds its state mutex).
#ifndef ZO_SERVER_STATE_SNAPSHOT_H_
#define ZO_SERVER_STATE_SNAPSHOT_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/sharding.h"
#include "offload/checkpoint/checkpoint_part.h"
#include "offload/tier/tiered_state.h"
#include "server/gradient_accumulator.h"
#include "server/param_versions.h"
#include "server/snapshot_staging.h"

namespace zo {

class StateSnapshot {
 public:
  // The version before the snapshot's, to carry in the part: a lease that
  // keeps it (read in pieces: it may be recomputed rather than stored),
  // local offsets, `bytes` per element.
  struct Previous {
    ParamVersions::Lease lease;
    uint32_t bytes = 0;
  };
  // Creates the part file at `path` for `chunks` (local offsets, ascending
  // and contiguous from 0) of the state at `version`. `staging` (may be
  // null: no staging) lends the hook its copy buffers.
  static absl::StatusOr<std::unique_ptr<StateSnapshot>> Begin(
      const std::string& path, absl::Span<const LocalChunk> chunks, const ShardMap& map,
      int64_t version, std::shared_ptr<SnapshotStaging> staging = nullptr,
      std::optional<Previous> previous = std::nullopt);
  ~StateSnapshot();  // staged copies not written go back to the pool

  int64_t version() const { return version_; }
  const std::string& path() const { return writer_->path(); }

  // Takes the parts of local elements [offset, offset + n) not captured
  // yet, from master, m and v as they are now: `stage` copies them for
  // WriteStaged while staging buffers last, else they are written now.
  // Concurrent calls must cover disjoint ranges (a step's tiles do).
  void Capture(int64_t offset, int64_t n, const float* master, const float* m, const float* v,
               bool stage = false);
  // Capture with staging, as a step's TieredOptimizerState hook; valid while
  // the snapshot lives.
  StateObserver observer();
  // Writes the previous version's weights, if the part carries them and
  // they are not written yet, and releases their lease. Safe to call from
  // any thread, any number of times; the first failure is the snapshot's.
  // `from_a_step`: through the page cache (no waiting for the disk), for
  // the update that would overwrite them.
  absl::Status CapturePrevious(bool from_a_step = false);
  // Writes every staged copy (the background writer's job).
  absl::Status WriteStaged();
  // Waits until complete, a staged copy waits to be written, or `deadline`.
  void WaitForWork(absl::Time deadline) const;

  // Captures up to `max_elems` RAM-resident elements not captured yet,
  // reading them from `state`. Returns whether any RAM-resident element is
  // still not captured afterwards.
  absl::StatusOr<bool> CaptureSomeFromRam(TieredOptimizerState& state, int64_t max_elems);
  // Captures everything left: RAM ranges, then NVMe through one observe pass.
  absl::Status CaptureRest(TieredOptimizerState& state);

  // Every element captured and written (or the snapshot failed).
  bool complete() const;
  // Fails the snapshot with `why` (a restore replaced the state it was
  // taking, the step that was to carry it failed): Finish returns it.
  void Abort(absl::Status why);

  // Hashes and fsyncs the part once complete() (FAILED_PRECONDITION before).
  absl::StatusOr<CheckpointPartSummary> Finish();

  StateSnapshot(const StateSnapshot&) = delete;
  StateSnapshot& operator=(const StateSnapshot&) = delete;

 private:
  StateSnapshot(std::unique_ptr<ScatteredPartWriter> writer, std::vector<LocalChunk> chunks,
                int64_t total, int64_t version, std::shared_ptr<SnapshotStaging> staging,
                std::optional<Previous> previous);
  struct Staged {
    int64_t begin = 0, end = 0;
    int64_t stride = 0;  // master at 0, m at stride, v at 2 * stride; end - begin floats each
    AlignedBuffer data;
  };
  // The stride of a staged copy of k elements.
  int64_t StrideFor(int64_t k) const;
  // Writes `batch` (sorted here) as runs of neighbouring copies.
  absl::Status WriteBatch(std::vector<Staged>& batch);
  // Claims the uncaptured pieces of [begin, end) (marks them captured and
  // counts them in flight); requires mu_.
  std::vector<std::pair<int64_t, int64_t>> ClaimLocked(int64_t begin, int64_t end);
  // The first uncaptured range at or after `from`, clipped to `limit`
  // elements and to `end`; {end, end} when none. Requires mu_.
  std::pair<int64_t, int64_t> NextGapLocked(int64_t from, int64_t end, int64_t limit) const;
  // Every element captured and written, or the snapshot failed. Requires mu_.
  bool CompleteLocked() const {
    return !error_.ok() || (uncaptured_ == 0 && in_flight_ == 0 && !previous_pending_);
  }
  absl::Status WriteRange(int64_t begin, int64_t end, const float* master, const float* m,
                          const float* v);

  const std::unique_ptr<ScatteredPartWriter> writer_;
  const std::vector<LocalChunk> chunks_;
  const int64_t total_;
  const int64_t version_;
  const std::shared_ptr<SnapshotStaging> staging_;

  // Held while the previous version is written (never with mu_ waited on).
  std::mutex previous_mu_;
  std::optional<Previous> previous_;  // until written, or the snapshot aborts

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::map<int64_t, int64_t> captured_;  // disjoint [begin, end), merged
  int64_t uncaptured_ = 0;               // elements not claimed yet
  int in_flight_ = 0;                    // claimed ranges still being written or staged
  std::deque<Staged> staged_;            // copies waiting for WriteStaged
  bool previous_pending_ = false;        // the previous version is not written yet
  absl::Status error_;                   // the first failure, sticky
};

}  // namespace zo

#endif  // ZO_SERVER_STATE_SNAPSHOT_H_
