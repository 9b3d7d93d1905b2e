// How a stage that streams its parameters splits a device memory budget
// (zo-train --device-memory-budget): the rest of the step (the schedule's
// activations, one layer's gradients and their 16-bit copies, the loss)
// takes what it takes at most, and the weight window gets the remainder.
//
// "What it takes" is found by running one whole step of the stage, with its
// real layers, schedule, checkpointing and pushes, on a backend that
// computes nothing (DryRunBackend): the plan is exact for a backend that
// allocates what the CPU backend does, before the first real step.
#ifndef ZO_WORKER_MODEL_DEVICE_MEMORY_PLAN_H_
#define ZO_WORKER_MODEL_DEVICE_MEMORY_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/layer.h"
#include "worker/model/model.h"
#include "worker/model/model_stage.h"
#include "worker/pipeline/schedule.h"

namespace zo::model {

struct DeviceMemoryPlanInput {
  // A model shaped as the trained one; the plan binds it to its own backend,
  // so it must be a copy the caller does not compute with.
  Model model;
  std::vector<int> bounds;  // as ModelStage::Create's
  // The stage as it will run; weight_window_bytes and
  // push_every_micro_batch are the plan's to set (streaming pushes each
  // micro-batch's gradients).
  StageOptions options;
  pipeline::StageProgram program;  // the stage's instructions for one step
  // A micro-batch of the run's shape (only its sizes matter).
  MicroBatch micro_batch;
};

struct DeviceMemoryPlan {
  int64_t budget_bytes = 0;
  // The most the step holds at once besides the weights.
  int64_t step_bytes = 0;
  // The stage's largest layer, whose weights the window must hold.
  std::string largest_layer;
  int64_t largest_layer_bytes = 0;
  // budget_bytes - step_bytes: StageOptions::weight_window_bytes.
  int64_t window_bytes = 0;
  int64_t stage_weight_bytes = 0;  // every weight of the stage
};

// INVALID_ARGUMENT when the budget cannot hold the step plus the largest
// layer's weights, naming that layer and the bytes needed; what a dry
// step returns when it fails (a malformed program).
absl::StatusOr<DeviceMemoryPlan> PlanDeviceMemory(DeviceMemoryPlanInput input,
                                                  int64_t budget_bytes);

}  // namespace zo::model

#endif  // ZO_WORKER_MODEL_DEVICE_MEMORY_PLAN_H_
