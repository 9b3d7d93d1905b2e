#include "worker/pipeline/executor.h"

#include <chrono>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_context.h"
#include "common/status_macros.h"

namespace zo::pipeline {
namespace {

using Clock = std::chrono::steady_clock;
using Key = std::pair<int, int>;  // (micro_batch, chunk)

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// The tensors between a receive and the compute it feeds, or between a
// compute and the send that forwards its result.
class Held {
 public:
  explicit Held(const char* what) : what_(what) {}

  absl::Status Put(Key key, backend::Tensor tensor) {
    if (!map_.emplace(key, std::move(tensor)).second) {
      return absl::InternalError(
          absl::StrCat("the program already holds a ", what_, " for this micro-batch and chunk"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<backend::Tensor> Take(Key key) {
    auto it = map_.find(key);
    if (it == map_.end()) {
      return absl::InternalError(
          absl::StrCat("the program holds no ", what_, " for this micro-batch and chunk"));
    }
    backend::Tensor t = std::move(it->second);
    map_.erase(it);
    return t;
  }

  size_t size() const { return map_.size(); }
  const char* what() const { return what_; }

 private:
  const char* const what_;
  std::map<Key, backend::Tensor> map_;
};

// One step of a stage's program: the tensors it holds between instructions,
// the time each kind of instruction took, and one method per instruction.
class StepRun {
 public:
  StepRun(int64_t step, int stage, int stages, int chunks, const StageProgram& program,
          StageModule& module, Transport& transport)
      : step_(step),
        stage_(stage),
        stages_(stages),
        chunks_(chunks),
        last_virtual_(stages * chunks - 1),
        next_stage_((stage + 1) % stages),
        previous_stage_((stage + stages - 1) % stages),
        module_(module),
        transport_(transport) {
    // The index of the last kBackward of each chunk: its backward may push
    // every gradient of the chunk as soon as it is final.
    for (size_t i = 0; i < program.size(); ++i) {
      if (program[i].op == Op::kBackward) last_backward_[program[i].chunk] = i;
    }
  }

  // Runs instruction `index` of the program, adding its time to times().
  absl::Status Run(size_t index, const Instruction& in) {
    if (in.chunk < 0 || in.chunk >= chunks_) {
      return absl::InternalError(absl::StrCat("chunk out of range [0, ", chunks_, ")"));
    }
    const Clock::time_point start = Clock::now();
    switch (in.op) {
      case Op::kPullWeights:
        return Timed(module_.BeginStep(step_), start, times_.pull_s);
      case Op::kLoadMicroBatch:
        return Timed(module_.LoadMicroBatch(step_, in.micro_batch), start, times_.compute_s);
      case Op::kRecvActivation:
        return RecvActivation(in, start);
      case Op::kForward:
        return Forward(in, start);
      case Op::kSendActivation:
        return SendActivation(in, start);
      case Op::kRecvGrad:
        return RecvGrad(in, start);
      case Op::kBackward:
        return Backward(index, in, start);
      case Op::kSendGrad:
        return SendGrad(in, start);
      case Op::kPushGradients:
        return PushGradients(start);
    }
    return absl::InternalError("unknown instruction");
  }

  const StepTimes& times() const { return times_; }

 private:
  static absl::Status Timed(absl::Status s, Clock::time_point start, double& total) {
    total += Seconds(start);
    return s;
  }
  int VirtualStage(const Instruction& in) const { return in.chunk * stages_ + stage_; }
  static Key KeyOf(const Instruction& in) { return {in.micro_batch, in.chunk}; }

  absl::Status RecvActivation(const Instruction& in, Clock::time_point start) {
    if (VirtualStage(in) == 0) return absl::InternalError("virtual stage 0 receives no activation");
    absl::StatusOr<backend::Tensor> t =
        transport_.Recv(previous_stage_,
                        MessageTag{MessageTag::Kind::kActivation, step_, in.micro_batch, in.chunk});
    times_.transfer_s += Seconds(start);
    if (!t.ok()) return t.status();
    return received_activations_.Put(KeyOf(in), *std::move(t));
  }

  absl::Status Forward(const Instruction& in, Clock::time_point start) {
    backend::Tensor input;
    if (VirtualStage(in) != 0) {
      ZO_ASSIGN_OR_RETURN(input, received_activations_.Take(KeyOf(in)));
    }
    absl::StatusOr<backend::Tensor> out = module_.Forward(in.micro_batch, in.chunk, input);
    times_.compute_s += Seconds(start);
    if (!out.ok()) return out.status();
    if (VirtualStage(in) == last_virtual_) return absl::OkStatus();  // the loss stays inside
    if (!out->defined()) {
      return absl::InternalError("the module returned no activation for the next stage");
    }
    return activations_to_send_.Put(KeyOf(in), *std::move(out));
  }

  absl::Status SendActivation(const Instruction& in, Clock::time_point start) {
    if (VirtualStage(in) == last_virtual_) {
      return absl::InternalError("the last virtual stage sends no activation");
    }
    ZO_ASSIGN_OR_RETURN(const backend::Tensor t, activations_to_send_.Take(KeyOf(in)));
    // The last stage's chunk c feeds the first stage's chunk c + 1.
    const int receiver_chunk = in.chunk + (stage_ == stages_ - 1 ? 1 : 0);
    return Timed(
        transport_.Send(
            next_stage_,
            MessageTag{MessageTag::Kind::kActivation, step_, in.micro_batch, receiver_chunk}, t),
        start, times_.transfer_s);
  }

  absl::Status RecvGrad(const Instruction& in, Clock::time_point start) {
    if (VirtualStage(in) == last_virtual_) {
      return absl::InternalError("the last virtual stage receives no gradient");
    }
    absl::StatusOr<backend::Tensor> t = transport_.Recv(
        next_stage_, MessageTag{MessageTag::Kind::kGrad, step_, in.micro_batch, in.chunk});
    times_.transfer_s += Seconds(start);
    if (!t.ok()) return t.status();
    return received_grads_.Put(KeyOf(in), *std::move(t));
  }

  absl::Status Backward(size_t index, const Instruction& in, Clock::time_point start) {
    backend::Tensor grad_output;
    if (VirtualStage(in) != last_virtual_) {
      ZO_ASSIGN_OR_RETURN(grad_output, received_grads_.Take(KeyOf(in)));
    }
    const bool last_for_chunk = last_backward_[in.chunk] == index;
    absl::StatusOr<backend::Tensor> grad_input =
        module_.Backward(in.micro_batch, in.chunk, grad_output, last_for_chunk);
    times_.compute_s += Seconds(start);
    if (!grad_input.ok()) return grad_input.status();
    if (VirtualStage(in) == 0) return absl::OkStatus();
    if (!grad_input->defined()) {
      return absl::InternalError("the module returned no gradient for the previous stage");
    }
    return grads_to_send_.Put(KeyOf(in), *std::move(grad_input));
  }

  absl::Status SendGrad(const Instruction& in, Clock::time_point start) {
    if (VirtualStage(in) == 0) return absl::InternalError("virtual stage 0 sends no gradient");
    ZO_ASSIGN_OR_RETURN(const backend::Tensor t, grads_to_send_.Take(KeyOf(in)));
    // The first stage's chunk c answers the last stage's chunk c - 1.
    const int receiver_chunk = in.chunk - (stage_ == 0 ? 1 : 0);
    return Timed(transport_.Send(
                     previous_stage_,
                     MessageTag{MessageTag::Kind::kGrad, step_, in.micro_batch, receiver_chunk}, t),
                 start, times_.transfer_s);
  }

  absl::Status PushGradients(Clock::time_point start) {
    for (const Held* held :
         {&received_activations_, &activations_to_send_, &received_grads_, &grads_to_send_}) {
      if (held->size() != 0) {
        return absl::InternalError(absl::StrCat("the program ends the step with ", held->size(),
                                                " ", held->what(), "(s) unused"));
      }
    }
    return Timed(module_.FinishStep(step_), start, times_.push_s);
  }

  const int64_t step_;
  const int stage_;
  const int stages_;
  const int chunks_;
  const int last_virtual_;
  const int next_stage_;
  const int previous_stage_;
  StageModule& module_;
  Transport& transport_;
  std::map<int, size_t> last_backward_;
  Held received_activations_{"received activation"};
  Held activations_to_send_{"activation to send"};
  Held received_grads_{"received gradient"};
  Held grads_to_send_{"gradient to send"};
  StepTimes times_;
};

}  // namespace

Executor::Executor(int stage, int stages, int chunks, StageProgram program, StageModule& module,
                   Transport& transport)
    : stage_(stage),
      stages_(stages),
      chunks_(chunks),
      program_(std::move(program)),
      module_(module),
      transport_(transport) {}

absl::StatusOr<StepTimes> Executor::RunStep(int64_t step) {
  const Clock::time_point step_start = Clock::now();
  StepRun run(step, stage_, stages_, chunks_, program_, module_, transport_);
  for (size_t i = 0; i < program_.size(); ++i) {
    if (absl::Status s = run.Run(i, program_[i]); !s.ok()) {
      return WithContext(
          s, absl::StrCat("step ", step, ", stage ", stage_, ", ", ToString(program_[i])));
    }
  }
  StepTimes times = run.times();
  const double late_weights_s = module_.weights_wait_s();
  times.compute_s -= late_weights_s;
  times.pull_s += late_weights_s;
  times.total_s = Seconds(step_start);
  return times;
}

}  // namespace zo::pipeline
