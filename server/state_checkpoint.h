// One server's share of a job checkpoint (offload/checkpoint/design.md): its
// chunks' optimizer state out to a part file, any committed checkpoint's
// state back into its chunks (whatever server count wrote it), and what
// JobStatus reports for the newest step of a checkpoint. Job runs the
// protocol around these (the lead commits once every part is written); the
// pieces here touch no job state and take no locks.
//
// Thread-compatible: the caller keeps the state from being stepped while a
// part is written or loaded (Job holds its state mutex).
#ifndef ZO_SERVER_STATE_CHECKPOINT_H_
#define ZO_SERVER_STATE_CHECKPOINT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/sharding.h"
#include "offload/checkpoint/checkpoint_dir.h"
#include "offload/checkpoint/checkpoint_part.h"
#include "offload/tier/tiered_state.h"
#include "server/gradient_accumulator.h"

namespace zo {

// Names and shapes; a checkpoint restores onto the job it was written by.
bool SameManifest(const std::vector<TensorSpec>& a, const std::vector<TensorSpec>& b);

// Writes master, m and v of `chunks` (local offsets into `state`) to the
// part file `path`.
absl::StatusOr<CheckpointPartSummary> WriteStatePart(TieredOptimizerState& state,
                                                     absl::Span<const LocalChunk> chunks,
                                                     const ShardMap& map, const std::string& path);

// Reads `chunks` from the checkpoint into `state`, their master rounded to
// `dtype` into `low_precision` (the served copy, local offsets; null when
// pulls are served from the master itself), and the previous version's
// weights into `previous` (local offsets; null: not wanted). Stops at the
// first error; chunks before it are loaded.
absl::Status LoadStatePart(CheckpointReader& reader, absl::Span<const LocalChunk> chunks,
                           const ShardMap& map, TieredOptimizerState& state, void* low_precision,
                           DType dtype, void* previous = nullptr);

// The newest step as JobStatus reports it after restoring `meta`.
struct LastStep {
  double grad_norm = 0.0;
  double lr = 0.0;
  bool skipped = false;
  // The checkpoint predates last_step: lr is recomputed from the schedule
  // (a function of the applied steps), the norm is lost and reads 0.
  bool derived = false;
};
LastStep LastStepOf(const CheckpointMeta& meta, const Config& config);

}  // namespace zo

#endif  // ZO_SERVER_STATE_CHECKPOINT_H_
