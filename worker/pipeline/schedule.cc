#include "worker/pipeline/schedule.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace zo::pipeline {
namespace {

absl::Status ValidateShape(int stages, int micro_batches) {
  if (stages < 1) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline stages must be >= 1, got ", stages));
  }
  if (micro_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline micro_batches must be >= 1, got ", micro_batches));
  }
  return absl::OkStatus();
}

// Appends the instructions of one forward or backward of (micro_batch, chunk)
// on `stage`, with the loads, receives and sends around it. Chunk c of stage
// s is virtual stage c * stages + s of stages * chunks.
class ProgramBuilder {
 public:
  ProgramBuilder(int stages, int chunks, int stage, StageProgram* program)
      : stages_(stages), chunks_(chunks), stage_(stage), program_(program) {}

  void Forward(int micro_batch, int chunk) {
    const int virtual_stage = chunk * stages_ + stage_;
    if (virtual_stage == 0) {
      Add(Op::kLoadMicroBatch, micro_batch, chunk);
    } else {
      Add(Op::kRecvActivation, micro_batch, chunk);
    }
    Add(Op::kForward, micro_batch, chunk);  // the last virtual stage computes the loss here
    if (virtual_stage != last_virtual_stage()) Add(Op::kSendActivation, micro_batch, chunk);
  }

  void Backward(int micro_batch, int chunk) {
    const int virtual_stage = chunk * stages_ + stage_;
    if (virtual_stage != last_virtual_stage()) Add(Op::kRecvGrad, micro_batch, chunk);
    Add(Op::kBackward, micro_batch, chunk);
    if (virtual_stage != 0) Add(Op::kSendGrad, micro_batch, chunk);
  }

  void Begin() { Add(Op::kPullWeights, 0, 0); }
  void End() { Add(Op::kPushGradients, 0, 0); }

 private:
  int last_virtual_stage() const { return stages_ * chunks_ - 1; }
  void Add(Op op, int micro_batch, int chunk) {
    program_->push_back(Instruction{op, micro_batch, chunk});
  }

  const int stages_;
  const int chunks_;
  const int stage_;
  StageProgram* const program_;
};

}  // namespace

const char* OpName(Op op) {
  switch (op) {
    case Op::kLoadMicroBatch:
      return "LoadMicroBatch";
    case Op::kForward:
      return "Forward";
    case Op::kBackward:
      return "Backward";
    case Op::kSendActivation:
      return "SendActivation";
    case Op::kRecvActivation:
      return "RecvActivation";
    case Op::kSendGrad:
      return "SendGrad";
    case Op::kRecvGrad:
      return "RecvGrad";
    case Op::kPushGradients:
      return "PushGradients";
    case Op::kPullWeights:
      return "PullWeights";
  }
  return "Unknown";
}

std::string ToString(const Instruction& instruction) {
  return absl::StrCat(OpName(instruction.op), "(mb=", instruction.micro_batch,
                      ", chunk=", instruction.chunk, ")");
}

absl::StatusOr<std::vector<StageProgram>> GPipeSchedule(int stages, int micro_batches) {
  if (absl::Status s = ValidateShape(stages, micro_batches); !s.ok()) return s;
  std::vector<StageProgram> programs(stages);
  for (int stage = 0; stage < stages; ++stage) {
    ProgramBuilder b(stages, /*chunks=*/1, stage, &programs[stage]);
    b.Begin();
    for (int mb = 0; mb < micro_batches; ++mb) b.Forward(mb, 0);
    for (int mb = 0; mb < micro_batches; ++mb) b.Backward(mb, 0);
    b.End();
  }
  return programs;
}

absl::StatusOr<std::vector<StageProgram>> OneFOneBSchedule(int stages, int micro_batches) {
  if (absl::Status s = ValidateShape(stages, micro_batches); !s.ok()) return s;
  std::vector<StageProgram> programs(stages);
  for (int stage = 0; stage < stages; ++stage) {
    ProgramBuilder b(stages, /*chunks=*/1, stage, &programs[stage]);
    const int warmup = std::min(stages - stage - 1, micro_batches);
    b.Begin();
    int next_forward = 0;
    int next_backward = 0;
    while (next_forward < warmup) b.Forward(next_forward++, 0);
    while (next_forward < micro_batches) {  // steady state: one forward, one backward
      b.Forward(next_forward++, 0);
      b.Backward(next_backward++, 0);
    }
    while (next_backward < micro_batches) b.Backward(next_backward++, 0);  // cooldown
    b.End();
  }
  return programs;
}

absl::StatusOr<std::vector<StageProgram>> InterleavedOneFOneBSchedule(int stages, int micro_batches,
                                                                      int virtual_chunks) {
  if (absl::Status s = ValidateShape(stages, micro_batches); !s.ok()) return s;
  if (virtual_chunks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline virtual_chunks must be >= 1, got ", virtual_chunks));
  }
  if (micro_batches % stages != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("interleaved pipeline schedule needs micro_batches (", micro_batches,
                     ") to be a multiple of stages (", stages, ")"));
  }
  if (virtual_chunks == 1) return OneFOneBSchedule(stages, micro_batches);

  // Megatron numbers the stage's forwards (and, separately, its backwards)
  // k = 0 .. micro_batches * chunks - 1: groups of stages * chunks, inside
  // which `stages` consecutive micro-batches go through chunk 0, then chunk
  // 1, ... Backwards walk the chunks in reverse.
  const int group = stages * virtual_chunks;
  const int total = micro_batches * virtual_chunks;
  auto micro_batch_of = [&](int k) { return (k / group) * stages + (k % group) % stages; };
  auto chunk_of = [&](int k, bool forward) {
    const int chunk = (k % group) / stages;
    return forward ? chunk : virtual_chunks - 1 - chunk;
  };

  std::vector<StageProgram> programs(stages);
  for (int stage = 0; stage < stages; ++stage) {
    ProgramBuilder b(stages, virtual_chunks, stage, &programs[stage]);
    const int warmup = std::min((stages - stage - 1) * 2 + (virtual_chunks - 1) * stages, total);
    b.Begin();
    int next_forward = 0;
    int next_backward = 0;
    for (; next_forward < warmup; ++next_forward) {
      b.Forward(micro_batch_of(next_forward), chunk_of(next_forward, true));
    }
    for (; next_forward < total; ++next_forward, ++next_backward) {
      b.Forward(micro_batch_of(next_forward), chunk_of(next_forward, true));
      b.Backward(micro_batch_of(next_backward), chunk_of(next_backward, false));
    }
    for (; next_backward < total; ++next_backward) {
      b.Backward(micro_batch_of(next_backward), chunk_of(next_backward, false));
    }
    b.End();
  }
  return programs;
}

}  // namespace zo::pipeline
