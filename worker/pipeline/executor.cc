#include "worker/pipeline/executor.h"

#include <chrono>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_context.h"

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
  StepTimes times;
  const int last_virtual = stages_ * chunks_ - 1;
  const int next_stage = (stage_ + 1) % stages_;
  const int previous_stage = (stage_ + stages_ - 1) % stages_;

  // The index of the last kBackward of each chunk: its backward may push
  // every gradient of the chunk as soon as it is final.
  std::map<int, size_t> last_backward;
  for (size_t i = 0; i < program_.size(); ++i) {
    if (program_[i].op == Op::kBackward) last_backward[program_[i].chunk] = i;
  }

  Held received_activations("received activation");
  Held activations_to_send("activation to send");
  Held received_grads("received gradient");
  Held grads_to_send("gradient to send");

  auto run = [&](size_t index, const Instruction& in) -> absl::Status {
    const Key key{in.micro_batch, in.chunk};
    if (in.chunk < 0 || in.chunk >= chunks_) {
      return absl::InternalError(absl::StrCat("chunk out of range [0, ", chunks_, ")"));
    }
    const int virtual_stage = in.chunk * stages_ + stage_;
    const Clock::time_point start = Clock::now();
    switch (in.op) {
      case Op::kPullWeights: {
        absl::Status s = module_.BeginStep(step);
        times.pull_s += Seconds(start);
        return s;
      }
      case Op::kLoadMicroBatch: {
        absl::Status s = module_.LoadMicroBatch(step, in.micro_batch);
        times.compute_s += Seconds(start);
        return s;
      }
      case Op::kRecvActivation: {
        if (virtual_stage == 0)
          return absl::InternalError("virtual stage 0 receives no activation");
        absl::StatusOr<backend::Tensor> t = transport_.Recv(
            previous_stage,
            MessageTag{MessageTag::Kind::kActivation, step, in.micro_batch, in.chunk});
        times.transfer_s += Seconds(start);
        if (!t.ok()) return t.status();
        return received_activations.Put(key, *std::move(t));
      }
      case Op::kForward: {
        backend::Tensor input;
        if (virtual_stage != 0) {
          absl::StatusOr<backend::Tensor> t = received_activations.Take(key);
          if (!t.ok()) return t.status();
          input = *std::move(t);
        }
        absl::StatusOr<backend::Tensor> out = module_.Forward(in.micro_batch, in.chunk, input);
        times.compute_s += Seconds(start);
        if (!out.ok()) return out.status();
        if (virtual_stage == last_virtual) return absl::OkStatus();  // the loss stays inside
        if (!out->defined()) {
          return absl::InternalError("the module returned no activation for the next stage");
        }
        return activations_to_send.Put(key, *std::move(out));
      }
      case Op::kSendActivation: {
        if (virtual_stage == last_virtual) {
          return absl::InternalError("the last virtual stage sends no activation");
        }
        absl::StatusOr<backend::Tensor> t = activations_to_send.Take(key);
        if (!t.ok()) return t.status();
        const int receiver_chunk = in.chunk + (stage_ == stages_ - 1 ? 1 : 0);
        absl::Status s = transport_.Send(
            next_stage,
            MessageTag{MessageTag::Kind::kActivation, step, in.micro_batch, receiver_chunk}, *t);
        times.transfer_s += Seconds(start);
        return s;
      }
      case Op::kRecvGrad: {
        if (virtual_stage == last_virtual) {
          return absl::InternalError("the last virtual stage receives no gradient");
        }
        absl::StatusOr<backend::Tensor> t = transport_.Recv(
            next_stage, MessageTag{MessageTag::Kind::kGrad, step, in.micro_batch, in.chunk});
        times.transfer_s += Seconds(start);
        if (!t.ok()) return t.status();
        return received_grads.Put(key, *std::move(t));
      }
      case Op::kBackward: {
        backend::Tensor grad_output;
        if (virtual_stage != last_virtual) {
          absl::StatusOr<backend::Tensor> t = received_grads.Take(key);
          if (!t.ok()) return t.status();
          grad_output = *std::move(t);
        }
        const bool last_for_chunk = last_backward[in.chunk] == index;
        absl::StatusOr<backend::Tensor> grad_input =
            module_.Backward(in.micro_batch, in.chunk, grad_output, last_for_chunk);
        times.compute_s += Seconds(start);
        if (!grad_input.ok()) return grad_input.status();
        if (virtual_stage == 0) return absl::OkStatus();
        if (!grad_input->defined()) {
          return absl::InternalError("the module returned no gradient for the previous stage");
        }
        return grads_to_send.Put(key, *std::move(grad_input));
      }
      case Op::kSendGrad: {
        if (virtual_stage == 0) return absl::InternalError("virtual stage 0 sends no gradient");
        absl::StatusOr<backend::Tensor> t = grads_to_send.Take(key);
        if (!t.ok()) return t.status();
        const int receiver_chunk = in.chunk - (stage_ == 0 ? 1 : 0);
        absl::Status s = transport_.Send(
            previous_stage,
            MessageTag{MessageTag::Kind::kGrad, step, in.micro_batch, receiver_chunk}, *t);
        times.transfer_s += Seconds(start);
        return s;
      }
      case Op::kPushGradients: {
        for (const Held* held :
             {&received_activations, &activations_to_send, &received_grads, &grads_to_send}) {
          if (held->size() != 0) {
            return absl::InternalError(absl::StrCat("the program ends the step with ", held->size(),
                                                    " ", held->what(), "(s) unused"));
          }
        }
        absl::Status s = module_.FinishStep(step);
        times.push_s += Seconds(start);
        return s;
      }
    }
    return absl::InternalError("unknown instruction");
  };

  for (size_t i = 0; i < program_.size(); ++i) {
    if (absl::Status s = run(i, program_[i]); !s.ok()) {
      return WithContext(
          s, absl::StrCat("step ", step, ", stage ", stage_, ", ", ToString(program_[i])));
    }
  }
  times.total_s = Seconds(step_start);
  return times;
}

}  // namespace zo::pipeline
