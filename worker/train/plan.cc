#include "worker/train/plan.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "offload/io/direct_file.h"
#include "worker/data/synthetic_source.h"
#include "worker/model/partition.h"
#include "worker/train/weight_file.h"

namespace zo::train {
namespace {

// Bytes of synthetic text for a run without --data: plenty for a demo.
constexpr size_t kSyntheticBytes = size_t{1} << 20;

absl::StatusOr<std::vector<pipeline::StageProgram>> Programs(const TrainOptions& o,
                                                             int micro_batches) {
  if (o.schedule == "gpipe") return pipeline::GPipeSchedule(o.pipeline_stages, micro_batches);
  if (o.schedule == "1f1b") return pipeline::OneFOneBSchedule(o.pipeline_stages, micro_batches);
  return pipeline::InterleavedOneFOneBSchedule(o.pipeline_stages, micro_batches, o.virtual_chunks);
}

absl::StatusOr<model::Model> MakeModel(const TrainOptions& o, const Plan& plan) {
  if (o.model == "gpt") {
    model::GptConfig gpt = o.gpt;
    gpt.vocab = plan.text->vocab().size();
    return model::MakeGpt(gpt);
  }
  return model::MakeMlp(o.mlp, plan.dtype);
}

// A micro-batch of the run's shape, for the device memory plan.
model::MicroBatch ShapeOfMicroBatch(const TrainOptions& o, const Plan& plan) {
  if (o.model != "gpt") return model::MlpMicroBatch(o.mlp, o.seed, 0, 0, 0, plan.micro_batch_size);
  model::MicroBatch mb;
  mb.batch = plan.micro_batch_size;
  mb.block_size = o.gpt.block_size;
  mb.tokens.assign(static_cast<size_t>(mb.rows()), 0);
  mb.targets.assign(static_cast<size_t>(mb.rows()), 0);
  return mb;
}

// --device-memory-budget: each stage of this process plans its window from
// an equal share of the budget (stages on threads share the device).
absl::Status PlanStageWindows(const TrainOptions& o, Plan& plan) {
  const int local_stages = o.stage >= 0 ? 1 : o.pipeline_stages;
  const int64_t share = o.device_memory_budget / local_stages;
  for (int s = 0; s < o.pipeline_stages; ++s) {
    if (o.stage >= 0 && s != o.stage) continue;
    ZO_ASSIGN_OR_RETURN(model::Model copy, MakeModel(o, plan));
    absl::StatusOr<model::DeviceMemoryPlan> stage_plan =
        model::PlanDeviceMemory({.model = std::move(copy),
                                 .bounds = plan.bounds,
                                 .options = StageOptionsFor(o, plan, s),
                                 .program = plan.programs[s],
                                 .micro_batch = ShapeOfMicroBatch(o, plan)},
                                share);
    if (!stage_plan.ok()) {
      const std::string of_it =
          local_stages > 1 ? absl::StrCat(" (1/", local_stages, " of it per stage)") : "";
      return absl::Status(
          stage_plan.status().code(),
          absl::StrCat("--device-memory-budget", of_it, ": ", stage_plan.status().message()));
    }
    plan.device_plans.emplace(s, *std::move(stage_plan));
  }
  return absl::OkStatus();
}

// zero_optimization.offload_param "cpu" streams each stage's weights
// through a window of stage3_max_live_parameters, --device-memory-budget
// through one planned to fit (ChooseGradientAccumulation then picks
// "servers"); what cannot be honoured is refused.
absl::Status PlanParamOffload(const TrainOptions& o, Plan& plan) {
  const ZeroConfig& zero = plan.config.zero_optimization;
  const bool budget = o.device_memory_budget > 0;
  if (zero.offload_param.device == OffloadDevice::kNone && !budget) return absl::OkStatus();
  if (zero.offload_param.device == OffloadDevice::kNvme) {
    // Now rather than at the first step, after the servers are reached.
    if (absl::Status direct = CheckDirectIo(zero.offload_param.nvme_path); !direct.ok()) {
      return absl::Status(direct.code(), absl::StrCat("zero_optimization.offload_param.nvme_path: ",
                                                      direct.message()));
    }
    for (const TensorSpec& t : plan.model.Manifest(plan.dtype)) {
      ZO_RETURN_IF_ERROR(
          CheckWeightBuffer(zero.offload_param.buffer_size, t.name, NumElements(t.shape)));
    }
  }
  if (plan.config.zo.gradient_accumulation == GradientAccumulation::kDevice) {
    return absl::InvalidArgumentError(absl::StrCat(
        budget ? "--device-memory-budget"
               : absl::StrCat("zero_optimization.offload_param.device = \"",
                              std::string(EnumName(zero.offload_param.device)), "\""),
        " streams the weights, but zo.gradient_accumulation = \"device\" would keep an fp32 "
        "gradient of every weight on the device: use \"servers\" (or \"auto\")"));
  }
  if (zero.offload_param.device != OffloadDevice::kNone) {
    // Any count beyond what a device could hold means "all of them"; the
    // clamp keeps the product in range for a count from the config file.
    const int64_t elem = static_cast<int64_t>(DTypeSize(plan.dtype));
    plan.weight_window_bytes =
        std::min(zero.stage3_max_live_parameters, std::numeric_limits<int64_t>::max() / elem) *
        elem;
  }
  return budget ? PlanStageWindows(o, plan) : absl::OkStatus();
}

}  // namespace

absl::Status CheckOptions(const TrainOptions& o) {
  if (o.model != "gpt" && o.model != "mlp") {
    return absl::InvalidArgumentError(
        absl::StrCat("--model must be gpt or mlp, not '", o.model, "'"));
  }
  if (o.pipeline_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pipeline-stages must be >= 1, got ", o.pipeline_stages));
  }
  if (o.restore_force && o.restore.empty()) {
    return absl::InvalidArgumentError("--restore-force needs --restore");
  }
  if (o.stage >= o.pipeline_stages) {
    return absl::InvalidArgumentError(absl::StrCat("--stage ", o.stage, " is outside the ",
                                                   o.pipeline_stages, " pipeline stages"));
  }
  if (o.stage >= 0 && o.pipeline_stages > 1) {
    if (static_cast<int>(o.stage_addresses.size()) != o.pipeline_stages) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stage needs --stage-addresses with one host:port per pipeline stage (",
                       o.pipeline_stages, "), got ", o.stage_addresses.size()));
    }
    if (o.servers.empty()) {
      return absl::InvalidArgumentError(
          "--stage runs one stage of a multi-process pipeline, whose processes must share "
          "offload servers: give --servers (the embedded server lives in one process)");
    }
  }
  if (o.steps < 1)
    return absl::InvalidArgumentError(absl::StrCat("--steps must be >= 1, got ", o.steps));
  if (o.checkpoint_every < 0) {
    return absl::InvalidArgumentError("--checkpoint-every must be >= 0");
  }
  if (o.activation_checkpoint_every < 0) {
    return absl::InvalidArgumentError("--activation-checkpoint-every must be >= 0");
  }
  if (o.schedule != "gpipe" && o.schedule != "1f1b" && o.schedule != "interleaved") {
    return absl::InvalidArgumentError(
        absl::StrCat("--schedule must be gpipe, 1f1b or interleaved, not '", o.schedule, "'"));
  }
  if (o.schedule != "interleaved" && o.virtual_chunks != 1) {
    return absl::InvalidArgumentError("--virtual-chunks needs --schedule interleaved");
  }
  return absl::OkStatus();
}

absl::StatusOr<Plan> MakePlan(const TrainOptions& o) {
  Plan plan;
  ZO_ASSIGN_OR_RETURN(LoadedConfig loaded,
                      ParseConfig(o.config_json, {.dp_world_size = o.dp_world_size}));
  plan.config = loaded.config;
  plan.dtype = plan.config.fp16.enabled   ? DType::kFloat16
               : plan.config.bf16.enabled ? DType::kBFloat16
                                          : DType::kFloat32;
  plan.micro_batches = static_cast<int>(plan.config.gradient_accumulation_steps);
  plan.micro_batch_size = static_cast<int>(plan.config.train_micro_batch_size_per_gpu);
  if (o.model == "gpt") {
    if (o.data_path.empty()) {
      ZO_ASSIGN_OR_RETURN(plan.text,
                          CharDataset::FromText(SyntheticText(kSyntheticBytes, o.seed), o.seed));
    } else {
      ZO_ASSIGN_OR_RETURN(plan.text, CharDataset::FromFile(o.data_path, o.seed));
    }
  }
  ZO_ASSIGN_OR_RETURN(plan.model, MakeModel(o, plan));
  std::vector<model::LayerWeightInfo> infos;
  for (const auto& layer : plan.model.layers) {
    infos.push_back({layer->type(), layer->param_count()});
  }
  ZO_ASSIGN_OR_RETURN(
      plan.bounds,
      model::PartitionLayers(infos, o.pipeline_stages * o.virtual_chunks, o.partition_method));
  ZO_ASSIGN_OR_RETURN(plan.programs, Programs(o, plan.micro_batches));
  ZO_RETURN_IF_ERROR(PlanParamOffload(o, plan));
  return plan;
}

int64_t Plan::WindowBytes(int stage) const {
  auto it = device_plans.find(stage);
  if (it == device_plans.end()) return weight_window_bytes;
  return weight_window_bytes > 0 ? std::min(weight_window_bytes, it->second.window_bytes)
                                 : it->second.window_bytes;
}

model::StageOptions StageOptionsFor(const TrainOptions& o, const Plan& plan, int stage) {
  return {.stage = stage,
          .stages = o.pipeline_stages,
          .chunks = o.virtual_chunks,
          .micro_batches = plan.micro_batches,
          .dtype = plan.dtype,
          .checkpoint_every = o.activation_checkpoint_every,
          .push_every_micro_batch =
              plan.config.zo.gradient_accumulation == GradientAccumulation::kServers,
          .weight_window_bytes = plan.WindowBytes(stage)};
}

namespace {

std::string WhereStreamedWeightsLive(const Plan& plan) {
  const OffloadParamConfig& p = plan.config.zero_optimization.offload_param;
  if (p.device != OffloadDevice::kNvme) {
    return "in host memory (where the servers share this host, their own copy, read a layer at "
           "a time)";
  }
  return absl::StrCat("in a file under ", p.nvme_path, " (pulled through a buffer of ",
                      p.buffer_size, " parameters, read a layer at a time)");
}

}  // namespace

void PrintPlan(const TrainOptions& o, const Plan& plan) {
  std::fprintf(o.out, "zo-train: %s\n", plan.model.Describe().c_str());
  const std::string servers = o.servers.empty()
                                  ? "embedded offload server"
                                  : absl::StrCat(o.servers.size(), " offload server(s)");
  std::fprintf(o.out,
               "zo-train: %s, %d micro-batches of %d per step, %d pipeline stage%s (%s, %s), "
               "%s\n",
               std::string(DTypeName(plan.dtype)).c_str(), plan.micro_batches,
               plan.micro_batch_size, o.pipeline_stages, o.pipeline_stages == 1 ? "" : "s",
               o.schedule.c_str(), o.partition_method.c_str(), servers.c_str());
  for (int v = 0; v + 1 < static_cast<int>(plan.bounds.size()); ++v) {
    int64_t params = 0;
    for (int j = plan.bounds[v]; j < plan.bounds[v + 1]; ++j) {
      params += plan.model.layers[j]->param_count();
    }
    const std::string chunk =
        o.virtual_chunks > 1 ? absl::StrCat(" chunk ", v / o.pipeline_stages) : "";
    std::fprintf(
        o.out, "zo-train:   stage %d%s: layers %s .. %s (%lld parameters)\n", v % o.pipeline_stages,
        chunk.c_str(), plan.model.layers[plan.bounds[v]]->name().c_str(),
        plan.model.layers[plan.bounds[v + 1] - 1]->name().c_str(), static_cast<long long>(params));
  }
  for (const auto& [stage, device] : plan.device_plans) {
    std::fprintf(o.out,
                 "zo-train: --device-memory-budget: stage %d gets %s: its step's activations, "
                 "gradients and loss take %s at most, its weights stream through a window of %s "
                 "(of %s; largest layer %s, %s)\n",
                 stage, FormatBytes(device.budget_bytes).c_str(),
                 FormatBytes(device.step_bytes).c_str(),
                 FormatBytes(plan.WindowBytes(stage)).c_str(),
                 FormatBytes(device.stage_weight_bytes).c_str(), device.largest_layer.c_str(),
                 FormatBytes(device.largest_layer_bytes).c_str());
  }
  if (plan.weight_window_bytes > 0) {
    std::fprintf(o.out,
                 "zo-train: parameters streamed (zero_optimization.offload_param): each stage "
                 "keeps its weights %s and at most %lld parameters (%s) of them on "
                 "the device at once, whole layers\n",
                 WhereStreamedWeightsLive(plan).c_str(),
                 static_cast<long long>(plan.config.zero_optimization.stage3_max_live_parameters),
                 FormatBytes(plan.weight_window_bytes).c_str());
  }
  if (plan.config.zo.dpu.enabled && plan.config.zo.dpu.compensation == DpuCompensation::kWorker) {
    std::fprintf(o.out,
                 "zo-train: DPU on after step %d, compensated (zo.dpu.compensation \"worker\"): "
                 "each step computes on the weights one step stale moved by the step before's "
                 "AdamW update, formed here from the last two versions, that step's gradients "
                 "and the servers' gain per tensor (two more copies of the weights on the "
                 "device); it waits for the step before's decision, not its update.\n",
                 plan.config.zo.dpu.warmup_steps);
  } else if (plan.config.zo.dpu.enabled) {
    std::fprintf(o.out,
                 "zo-train: DPU on after step %d: each step computes its gradients on weights one "
                 "step stale, so the servers' optimizer step overlaps the next forward/backward. "
                 "It pays when the compute step takes about as long as the server step; staleness "
                 "can slow the loss's descent, most while it falls steeply.\n",
                 plan.config.zo.dpu.warmup_steps);
  }
  std::fflush(o.out);  // before the servers are reached, which may take a while
}

absl::Status ChooseGradientAccumulation(const backend::Backend& backend, TrainOptions& o,
                                        Plan& plan) {
  GradientAccumulation& policy = plan.config.zo.gradient_accumulation;
  const int64_t micro = plan.config.gradient_accumulation_steps;
  std::string why = "zo.gradient_accumulation";
  if (plan.config.zo.dpu.compensation != DpuCompensation::kNone) {
    // The compensation moves each delayed step's weights by the step
    // before's gradients, which must still be here, on a device set of
    // weights (OffloadLink::CompensateDelayedSteps).
    const std::string what = absl::StrCat(
        "zo.dpu.compensation \"", std::string(EnumName(plan.config.zo.dpu.compensation)), "\"");
    if (plan.streams()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what,
                       " needs the stage's weights on the device: not with streamed parameters "
                       "(zero_optimization.offload_param, --device-memory-budget)"));
    }
    if (policy == GradientAccumulation::kServers) {
      return absl::InvalidArgumentError(
          absl::StrCat(what,
                       " needs the step's gradients kept here: not with zo.gradient_accumulation "
                       "\"servers\""));
    }
    if (policy == GradientAccumulation::kAuto) {
      policy = GradientAccumulation::kDevice;
      why = absl::StrCat("auto: ", what, " keeps the step's gradients");
    }
  }
  if (policy == GradientAccumulation::kAuto) {
    int64_t params = 0;
    for (int v = 0; v + 1 < static_cast<int>(plan.bounds.size()); ++v) {
      if (o.stage >= 0 && v % o.pipeline_stages != o.stage) continue;
      for (int j = plan.bounds[v]; j < plan.bounds[v + 1]; ++j) {
        params += plan.model.layers[j]->param_count();
      }
    }
    const int64_t device_bytes = params * (2 * static_cast<int64_t>(DTypeSize(plan.dtype)) + 4);
    const std::optional<int64_t> free = backend.FreeDeviceMemory();
    policy = !plan.streams() && (!free.has_value() || device_bytes <= *free / 2)
                 ? GradientAccumulation::kDevice
                 : GradientAccumulation::kServers;
    why = plan.streams() ? "auto: the weights are streamed"
          : free.has_value()
              ? absl::StrCat("auto: weights x2 and fp32 gradients need ", FormatBytes(device_bytes),
                             policy == GradientAccumulation::kDevice ? ", at most" : ", more than",
                             " half the ", FormatBytes(*free), " free on ", backend.name())
              : "auto: host memory";
  }
  if (policy == GradientAccumulation::kServers) {
    std::fprintf(o.out,
                 "zo-train: gradients summed on the servers (%s): each of the %lld micro-batches "
                 "pushes its own, no gradient tensors kept here\n",
                 why.c_str(), static_cast<long long>(micro));
  } else if (micro > 1) {
    std::fprintf(o.out, "zo-train: gradients summed here over %lld micro-batches (%s)\n",
                 static_cast<long long>(micro), why.c_str());
  }
  ZO_ASSIGN_OR_RETURN(o.config_json, WithGradientAccumulation(o.config_json, policy));
  return absl::OkStatus();
}

}  // namespace zo::train
