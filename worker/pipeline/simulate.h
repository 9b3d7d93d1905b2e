// A unit-time simulator that runs every stage's program of a schedule
// together, to check the schedule (no deadlock, sends and receives pairing
// up, forwards before backwards) and to measure it (makespan, bubble,
// activation memory) before any GPU time is spent on it.
//
// Model: kForward and kBackward occupy their stage for forward_time /
// backward_time; every other instruction takes no time. Sends are buffered
// (they never wait for the receiver, as with NCCL's async send plus enough
// buffer); a receive waits until the matching send has happened. A send and a
// receive match on (direction, micro_batch, virtual-stage boundary), where
// chunk c of stage s is virtual stage c * stages + s (see schedule.h): an
// activation sent by virtual stage V is received by V + 1, a gradient sent by
// V by V - 1, so only neighbouring stages (in a ring, for interleaving) talk.
#ifndef ZO_WORKER_PIPELINE_SIMULATE_H_
#define ZO_WORKER_PIPELINE_SIMULATE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/pipeline/schedule.h"

namespace zo::pipeline {

struct SimulationOptions {
  double forward_time = 1.0;
  double backward_time = 1.0;
};

struct SimulationResult {
  // When the last stage finishes its program.
  double makespan = 0;
  // Per stage: total time spent in forwards and backwards.
  std::vector<double> busy_time;
  // 1 - sum(busy_time) / (stages * makespan): the idle share of the
  // pipeline, i.e. the per-stage bubble fractions averaged.
  double bubble_fraction = 0;
  // Per stage: the most forwards (over all its chunks) whose backward had not
  // run yet, i.e. activations held at once.
  std::vector<int> peak_activations;
};

// Runs `programs` (one per stage, stage 0 first) to completion.
//   FAILED_PRECONDITION: deadlock (no stage can progress before all are done);
//     the message names each stuck stage and the receive it waits in.
//   INVALID_ARGUMENT: a malformed schedule: no programs, a receive from or a
//     send to a virtual stage that does not exist, a send repeated, a send
//     nobody receives, a backward without its forward, a forward repeated.
absl::StatusOr<SimulationResult> Simulate(absl::Span<const StageProgram> programs,
                                          const SimulationOptions& options = {});

}  // namespace zo::pipeline

#endif  // ZO_WORKER_PIPELINE_SIMULATE_H_
