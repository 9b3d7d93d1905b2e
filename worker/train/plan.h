// What zo-train's options and config make of a run before anything
// connects: the flags checked, the model built and cut into pipeline stages,
// each stage's program, and how gradients are summed. Printed once at start.
#ifndef ZO_WORKER_TRAIN_PLAN_H_
#define ZO_WORKER_TRAIN_PLAN_H_

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config.h"
#include "common/dtype.h"
#include "worker/backend/backend.h"
#include "worker/data/char_dataset.h"
#include "worker/model/device_memory_plan.h"
#include "worker/model/model.h"
#include "worker/model/model_stage.h"
#include "worker/pipeline/schedule.h"
#include "worker/train/trainer.h"

namespace zo::train {

struct Plan {
  Config config;
  DType dtype = DType::kFloat32;
  int micro_batches = 1;
  int micro_batch_size = 1;
  std::optional<CharDataset> text;  // GPT-lite's data
  model::Model model;
  std::vector<int> bounds;  // virtual stage v holds layers [bounds[v], bounds[v + 1])
  std::vector<pipeline::StageProgram> programs;
  // Parameter streaming (zero_optimization.offload_param.device "cpu"): the
  // most bytes of a stage's weights on the device at once; 0: all of them.
  int64_t weight_window_bytes = 0;
  // --device-memory-budget: each of this process's stages' plan, by stage
  // (empty without a budget); its window, capped by weight_window_bytes
  // when that is set too, is the stage's.
  std::map<int, model::DeviceMemoryPlan> device_plans;

  bool streams() const { return weight_window_bytes > 0 || !device_plans.empty(); }
  // What StageOptions::weight_window_bytes gets for `stage`.
  int64_t WindowBytes(int stage) const;
};

// INVALID_ARGUMENT naming the flag when the options do not make a run.
absl::Status CheckOptions(const TrainOptions& o);

// Parses the config, loads or makes the data, builds the model and
// partitions it into o.pipeline_stages * o.virtual_chunks stages.
absl::StatusOr<Plan> MakePlan(const TrainOptions& o);

// How stage `stage` runs (ModelStage's options).
model::StageOptions StageOptionsFor(const TrainOptions& o, const Plan& plan, int stage);

// The model, the step's shape and each stage's layers, to o.out.
void PrintPlan(const TrainOptions& o, const Plan& plan);

// Settles zo.gradient_accumulation for this process's stages ("auto":
// device when their weights, twice for the prefetch, and fp32 gradients take
// at most half the device's free memory), says so, and puts the choice in
// the config the job is opened with.
absl::Status ChooseGradientAccumulation(const backend::Backend& backend, TrainOptions& o,
                                        Plan& plan);

}  // namespace zo::train

#endif  // ZO_WORKER_TRAIN_PLAN_H_
