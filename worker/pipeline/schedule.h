// Pipeline-parallel schedules as data: one program of instructions per stage.
//
// A schedule is a pure function of (stages, micro_batches[, chunks]), so it
// can be checked on its own (every forward before its backward, sends and
// receives pairing up, no deadlock: see simulate.h) before an executor runs
// it against real activations, streams and the offload client.
//
// Conventions every schedule here follows:
//   - A program starts with kPullWeights and ends with kPushGradients. The
//     final kPushGradients marks the end of the step; the executor starts
//     pushing gradient buckets while the last micro-batch's backward still
//     runs, so the instruction is a flush point, not the whole push.
//   - Stage 0 runs kLoadMicroBatch before each forward of its first chunk; the
//     last stage's last chunk computes the loss inside its kForward.
//   - kRecvActivation precedes a forward and kSendActivation follows it;
//     kRecvGrad precedes a backward and kSendGrad follows it, wherever the
//     neighbouring (virtual) stage exists.
//   - Communication instructions carry the micro-batch and the chunk of the
//     local forward or backward they feed or come from. With v chunks, chunk
//     c of stage s is virtual stage c * stages + s; activations flow from
//     virtual stage V to V + 1 (stage stages-1 wraps to stage 0 of the next
//     chunk), gradients from V to V - 1.
#ifndef ZO_WORKER_PIPELINE_SCHEDULE_H_
#define ZO_WORKER_PIPELINE_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace zo::pipeline {

enum class Op {
  kLoadMicroBatch,
  kForward,
  kBackward,
  kSendActivation,
  kRecvActivation,
  kSendGrad,
  kRecvGrad,
  kPushGradients,
  kPullWeights,
};

// "Forward", "RecvGrad", ...
const char* OpName(Op op);

struct Instruction {
  Op op;
  int micro_batch = 0;  // meaningless (0) for kPullWeights / kPushGradients
  int chunk = 0;        // virtual stage chunk for interleaved schedules

  friend bool operator==(const Instruction&, const Instruction&) = default;
};

// "RecvGrad(mb=3, chunk=1)".
std::string ToString(const Instruction& instruction);

using StageProgram = std::vector<Instruction>;

// All forwards, then all backwards (Huang et al., GPipe). Peak activations per
// stage equal micro_batches. INVALID_ARGUMENT for stages < 1 or
// micro_batches < 1.
absl::StatusOr<std::vector<StageProgram>> GPipeSchedule(int stages, int micro_batches);

// PipeDream-Flush 1F1B as DeepSpeed's TrainSchedule runs it: stage s does
// min(stages - s - 1, micro_batches) warmup forwards, then alternates one
// forward and one backward, then drains the remaining backwards. Same bubble
// as GPipe, but at most min(stages - s, micro_batches) activations in flight.
// INVALID_ARGUMENT for stages < 1 or micro_batches < 1.
absl::StatusOr<std::vector<StageProgram>> OneFOneBSchedule(int stages, int micro_batches);

// Megatron-LM's interleaved 1F1B (Narayanan et al. 2021): each stage holds
// virtual_chunks model chunks, micro-batches go through the chunks in groups
// of `stages`, and warmup is (stages - s - 1) * 2 + (virtual_chunks - 1) *
// stages forwards (capped at the total). The bubble shrinks by about a factor
// of virtual_chunks at the cost of more activations and communication.
// INVALID_ARGUMENT for stages < 1, micro_batches < 1, virtual_chunks < 1, or
// micro_batches not a multiple of stages. virtual_chunks == 1 gives
// OneFOneBSchedule.
absl::StatusOr<std::vector<StageProgram>> InterleavedOneFOneBSchedule(int stages, int micro_batches,
                                                                      int virtual_chunks);

}  // namespace zo::pipeline

#endif  // ZO_WORKER_PIPELINE_SCHEDULE_H_
