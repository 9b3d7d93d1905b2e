#include "worker/model/device_memory_plan.h"

#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "worker/backend/dry_run_backend.h"
#include "worker/model/param_window.h"

namespace zo::model {
namespace {

using backend::Tensor;
using pipeline::Op;

// Pushes as OffloadLink does on the device: a 16-bit copy of the gradient,
// dropped once it is on its way.
class DryLink final : public ParamLink {
 public:
  DryLink(backend::Backend& backend, DType dtype) : backend_(backend), dtype_(dtype) {}
  absl::Status LoadWeights(int64_t, absl::Span<Param* const>) override { return absl::OkStatus(); }
  double LossScale(int64_t) override { return 1; }
  absl::Status PushGradient(int64_t, const Param& param, int) override {
    const Tensor low = backend_.Cast(param.grad, dtype_);
    return absl::OkStatus();
  }
  absl::Status FinishStep(int64_t) override { return absl::OkStatus(); }

 private:
  backend::Backend& backend_;
  const DType dtype_;
};

class SameBatches final : public BatchSource {
 public:
  explicit SameBatches(MicroBatch batch) : batch_(std::move(batch)) {}
  absl::StatusOr<MicroBatch> Get(int64_t, int) override { return batch_; }

 private:
  const MicroBatch batch_;
};

// Tensors between their receive (or make) and their use (or send).
using Held = std::map<std::pair<int, int>, Tensor>;

Tensor Take(Held& held, const pipeline::Instruction& in) {
  auto it = held.find({in.micro_batch, in.chunk});
  if (it == held.end()) return Tensor();
  Tensor t = std::move(it->second);
  held.erase(it);
  return t;
}

}  // namespace

absl::StatusOr<DeviceMemoryPlan> PlanDeviceMemory(DeviceMemoryPlanInput input,
                                                  int64_t budget_bytes) {
  if (budget_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a device memory budget must be positive, got ", budget_bytes));
  }
  backend::DryRunBackend dry;
  Model& model = input.model;
  StageOptions options = input.options;
  options.push_every_micro_batch = true;
  options.weight_window_bytes = 0;
  const DType dtype = options.dtype;

  // What crosses each layer boundary, from one forward of the whole model.
  std::vector<Tensor> outputs;  // undefined storage is fine: only shapes are read
  {
    for (auto& layer : model.layers) layer->Bind(dry, dtype, /*grads=*/false);
    Tensor x;
    for (auto& layer : model.layers) {
      Saved saved;
      x = layer->Forward(dry, x, input.micro_batch, saved);
      outputs.push_back(Tensor(x.dtype(), x.shape(), nullptr));
    }
  }

  DryLink link(dry, dtype);
  SameBatches source(input.micro_batch);
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<ModelStage> stage,
                      ModelStage::Create(dry, model, input.bounds, options, source, link));
  DeviceMemoryPlan plan;
  plan.budget_bytes = budget_bytes;
  for (int c = 0; c < options.chunks; ++c) {
    const int v = c * options.stages + options.stage;
    for (int j = input.bounds[v]; j < input.bounds[v + 1]; ++j) {
      const int64_t bytes = ParamWindow::LayerBytes(*model.layers[j], dtype);
      plan.stage_weight_bytes += bytes;
      if (bytes > plan.largest_layer_bytes) {
        plan.largest_layer_bytes = bytes;
        plan.largest_layer = model.layers[j]->name();
      }
    }
  }

  // One step of the program, as the executor runs it; the weights bound
  // above stay put, so what the step adds to them is its own.
  std::map<int, size_t> last_backward;
  for (size_t i = 0; i < input.program.size(); ++i) {
    if (input.program[i].op == Op::kBackward) last_backward[input.program[i].chunk] = i;
  }
  dry.ResetPeakAllocation();
  const int64_t weights = dry.allocation()->live_bytes;
  Held received, to_send;
  for (size_t i = 0; i < input.program.size(); ++i) {
    const pipeline::Instruction& in = input.program[i];
    const int v = in.chunk * options.stages + options.stage;
    switch (in.op) {
      case Op::kPullWeights:
        ZO_RETURN_IF_ERROR(stage->BeginStep(0));
        break;
      case Op::kLoadMicroBatch:
        ZO_RETURN_IF_ERROR(stage->LoadMicroBatch(0, in.micro_batch));
        break;
      case Op::kRecvActivation: {
        const Tensor& shape = outputs[input.bounds[v] - 1];
        received[{in.micro_batch, in.chunk}] = dry.Empty(shape.dtype(), shape.shape());
        break;
      }
      case Op::kRecvGrad: {
        const Tensor& shape = outputs[input.bounds[v + 1] - 1];
        received[{in.micro_batch, in.chunk}] = dry.Empty(shape.dtype(), shape.shape());
        break;
      }
      case Op::kForward: {
        ZO_ASSIGN_OR_RETURN(Tensor y, stage->Forward(in.micro_batch, in.chunk, Take(received, in)));
        if (y.defined()) to_send[{in.micro_batch, in.chunk}] = std::move(y);
        break;
      }
      case Op::kBackward: {
        ZO_ASSIGN_OR_RETURN(Tensor dx, stage->Backward(in.micro_batch, in.chunk, Take(received, in),
                                                       last_backward[in.chunk] == i));
        if (dx.defined()) to_send[{in.micro_batch, in.chunk}] = std::move(dx);
        break;
      }
      case Op::kSendActivation:
      case Op::kSendGrad:
        Take(to_send, in);
        break;
      case Op::kPushGradients:
        ZO_RETURN_IF_ERROR(stage->FinishStep(0));
        break;
    }
  }
  plan.step_bytes = dry.allocation()->peak_bytes - weights;
  plan.window_bytes = budget_bytes - plan.step_bytes;
  if (plan.window_bytes < plan.largest_layer_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a device memory budget of ", budget_bytes, " bytes (", FormatBytes(budget_bytes),
        ") is too small for stage ", options.stage, ": its step (activations, one layer's ",
        "gradients, the loss) takes ", plan.step_bytes, " bytes at most and layer ",
        plan.largest_layer, " needs ", plan.largest_layer_bytes, " bytes of weights beside it; ",
        "give at least ", plan.step_bytes + plan.largest_layer_bytes, " bytes (",
        FormatBytes(static_cast<double>(plan.step_bytes + plan.largest_layer_bytes)), ")"));
  }
  return plan;
}

}  // namespace zo::model
