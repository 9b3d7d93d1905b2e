// `zo-bench checkpoint`: what a checkpoint every N steps costs a training
// run (docs/architecture.md, "Performance": ratio >= 0.95).
//
// An OffloadServer runs in this process on loopback with a checkpoint
// directory under `dir`; one client trains a job of `params` fp16 elements
// whose state is in RAM: push every gradient, wait for the acknowledgement,
// pull the new weights. With `compute_ms` 0 the servers' Adam step is the
// whole step, so nothing hides a checkpoint's cost (the worst case); a
// positive `compute_ms` stands in for a GPU's forward and backward, during
// which the worker's CPU idles, as it does beside a GPU. Segments of `steps` steps run in three
// modes, rotating which goes first each round:
//
//   none        no checkpoint
//   background  a checkpoint asked every `every` steps (at every/2, then
//               every further `every`) and left to finish while training goes
//               on, as zo-train does; the segment ends once the last commits
//   blocking    the same checkpoints, the worker waiting for each commit (how
//               a checkpoint cost training before snapshots)
//
// and reports median steps/s per mode and ratio = background / none. With
// `dpu` the job runs the delayed parameter update: the worker pulls the
// version before the one it pushed, and each checkpoint also carries that
// version (2 bytes more per parameter).
#ifndef ZO_BENCH_CHECKPOINT_BENCH_H_
#define ZO_BENCH_CHECKPOINT_BENCH_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace zo::bench {

struct CheckpointBenchOptions {
  int64_t params = int64_t{32} << 20;
  int64_t chunk_elems = int64_t{4} << 20;
  int steps = 30;                // per segment
  int every = 10;                // steps between checkpoints
  int rounds = 3;                // segments of each mode
  int threads = 0;               // the server's optimizer threads; 0: one per core
  int compute_ms = 0;            // the worker's compute per step, as a GPU's: idle here
  std::string dir = "/var/tmp";  // a scratch folder is made in it, removed after
  bool dpu = false;              // the delayed parameter update
  bool json = false;
};

// INVALID_ARGUMENT naming the flag when `options` cannot work.
absl::Status ValidateCheckpointBenchOptions(const CheckpointBenchOptions& options);

// Runs the bench: results to `out`, progress to stderr.
absl::Status RunCheckpointBench(const CheckpointBenchOptions& options, std::ostream& out);

}  // namespace zo::bench

#endif  // ZO_BENCH_CHECKPOINT_BENCH_H_
