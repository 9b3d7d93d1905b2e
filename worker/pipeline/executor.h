// Runs one stage's program (schedule.h) for one training step against a
// stage module and a transport, and times where the step went.
#ifndef ZO_WORKER_PIPELINE_EXECUTOR_H_
#define ZO_WORKER_PIPELINE_EXECUTOR_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "worker/pipeline/schedule.h"
#include "worker/pipeline/stage_module.h"
#include "worker/pipeline/transport.h"

namespace zo::pipeline {

// Wall seconds of one step on one stage, by what the stage was doing.
struct StepTimes {
  double compute_s = 0;   // LoadMicroBatch, Forward, Backward (incl. queueing pushes)
  double pull_s = 0;      // waiting for weights: BeginStep, and in Forward for late layers
  double push_s = 0;      // FinishStep: waiting for the servers to acknowledge
  double transfer_s = 0;  // Send and Recv (a Recv includes waiting for the neighbour)
  double total_s = 0;
};

class Executor {
 public:
  // `program` is stage `stage`'s program of a schedule for `stages` stages
  // and `chunks` virtual chunks per stage.
  Executor(int stage, int stages, int chunks, StageProgram program, StageModule& module,
           Transport& transport);

  // Runs the program once. The first failing instruction's status is
  // returned with the instruction and step prepended; the stage is then in
  // an unknown state for this step (the caller retries the step or exits).
  absl::StatusOr<StepTimes> RunStep(int64_t step);

 private:
  int stage_;
  int stages_;
  int chunks_;
  StageProgram program_;
  StageModule& module_;
  Transport& transport_;
};

}  // namespace zo::pipeline

#endif  // ZO_WORKER_PIPELINE_EXECUTOR_H_
