#include "worker/model/testing/gpt_step.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "common/convert.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "worker/model/model_stage.h"
#include "worker/model/partition.h"
#include "worker/pipeline/executor.h"
#include "worker/pipeline/in_process_transport.h"
#include "worker/pipeline/schedule.h"

namespace zo::model::testing {
namespace {

constexpr uint64_t kSeed = 99;

}  // namespace

absl::Status CapturingLink::LoadWeights(int64_t, absl::Span<Param* const> params) {
  if (!late_) {
    for (Param* p : params) {
      if (absl::Status s = b_.UploadFloat(InitialValues(*p, kSeed), p->value); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  std::lock_guard<std::mutex> lock(mu_);  // stages share the link
  for (Param* p : params) {
    written_.erase(p);
    const std::vector<float> nan(static_cast<size_t>(p->numel()),
                                 std::numeric_limits<float>::quiet_NaN());
    if (absl::Status s = b_.UploadFloat(nan, p->value); !s.ok()) return s;
  }
  if (!params.empty()) {
    Param* first = params.front();
    if (absl::Status s = b_.UploadFloat(InitialValues(*first, kSeed), first->value); !s.ok()) {
      return s;
    }
    written_.insert(first);
  }
  return absl::OkStatus();
}

absl::Status CapturingLink::AwaitWeights(absl::Span<Param* const> first) {
  if (!late_ || first.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  result_.awaits[first.front()->name].push_back(first.size());
  for (Param* p : first) {
    if (written_.contains(p)) continue;
    if (absl::Status s = b_.UploadFloat(InitialValues(*p, kSeed), p->value); !s.ok()) return s;
    written_.insert(p);
  }
  return absl::OkStatus();
}

absl::StatusOr<HostWeights> CapturingLink::LoadHostWeights(int64_t,
                                                           absl::Span<Param* const> params) {
  std::lock_guard<std::mutex> lock(mu_);  // stages share the link
  std::vector<absl::Span<const std::byte>> spans;
  for (Param* p : params) {
    const std::vector<float> values = InitialValues(*p, kSeed);
    // Rounded as UploadFloat rounds: the stage computes on the same bits.
    std::vector<std::byte>& bytes = host_[p];
    bytes.resize(values.size() * DTypeSize(dtype_));
    FloatToDType(values.data(), dtype_, bytes.data(), values.size());
    spans.emplace_back(bytes.data(), bytes.size());
  }
  HostWeights weights;
  if (!read_ || params.empty()) {
    weights.bytes = std::move(spans);
    return weights;
  }
  const Param* const stage = params.front();
  weights.read = [this, stage](
                     absl::Span<const Param* const> layer,
                     int slot) -> absl::StatusOr<std::vector<absl::Span<const std::byte>>> {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::byte>& staging = slots_[{stage, slot}];
    size_t bytes = 0;
    for (const Param* p : layer) bytes += host_.at(p).size();
    // A new buffer each time: a stale span into the old one would read
    // freed memory (AddressSanitizer) or the wrong bytes.
    staging.assign(bytes, std::byte{0});
    std::vector<absl::Span<const std::byte>> out;
    size_t at = 0;
    for (const Param* p : layer) {
      const std::vector<std::byte>& src = host_.at(p);
      std::copy(src.begin(), src.end(), staging.begin() + static_cast<long>(at));
      out.emplace_back(staging.data() + at, src.size());
      at += src.size();
    }
    return out;
  };
  return weights;
}

absl::Status CapturingLink::PushGradient(int64_t, const Param& p, int micro_batch) {
  std::vector<float> g(static_cast<size_t>(p.numel()));
  if (absl::Status s = b_.DownloadFloat(p.grad, absl::MakeSpan(g)); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<float>& sum = result_.grads[p.name];
  if (micro_batch >= 0 && !sum.empty()) {
    for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
  } else {
    sum = std::move(g);
  }
  ++result_.pushes[p.name];
  result_.order.push_back(p.name);
  return absl::OkStatus();
}

absl::StatusOr<MicroBatch> PatternTokenSource::Get(int64_t step, int micro_batch) {
  MicroBatch mb;
  mb.batch = batch_;
  mb.block_size = block_;
  for (int i = 0; i < batch_ * block_; ++i) {
    mb.tokens.push_back(static_cast<int32_t>((i * 7 + micro_batch * 3 + step) % vocab_));
    mb.targets.push_back(static_cast<int32_t>((i * 5 + micro_batch + 1) % vocab_));
  }
  return mb;
}

int64_t WeightBytes(const GptConfig& config, DType dtype) {
  const absl::StatusOr<Model> model = MakeGpt(config);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? model->param_count() * static_cast<int64_t>(DTypeSize(dtype)) : 0;
}

std::vector<ScheduleCase> ScheduleCases() {
  return {{.name = "gpipe", .schedule = "gpipe"},
          {.name = "one_f_one_b"},
          {.name = "two_stages", .stages = 2},
          {.name = "interleaved", .stages = 2, .chunks = 2},
          {.name = "checkpointed", .checkpoint_every = 2}};
}

std::string ScheduleCaseName(const ::testing::TestParamInfo<ScheduleCase>& info) {
  return info.param.name;
}

GptStepOptions UnderSchedule(GptStepOptions options, const ScheduleCase& schedule) {
  options.stages = schedule.stages;
  options.chunks = schedule.chunks;
  options.schedule = schedule.schedule;
  options.checkpoint_every = schedule.checkpoint_every;
  return options;
}

absl::StatusOr<GptStepLayout> LayOutGptStep(const GptStepOptions& o) {
  ZO_ASSIGN_OR_RETURN(Model model, MakeGpt(o.model));
  std::vector<LayerWeightInfo> infos;
  for (const auto& l : model.layers) infos.push_back({l->type(), l->param_count()});
  GptStepLayout layout;
  ZO_ASSIGN_OR_RETURN(layout.bounds, PartitionLayers(infos, o.stages * o.chunks, "uniform"));
  ZO_ASSIGN_OR_RETURN(
      layout.programs,
      o.schedule == "gpipe" ? pipeline::GPipeSchedule(o.stages, o.micro_batches)
      : o.chunks == 1       ? pipeline::OneFOneBSchedule(o.stages, o.micro_batches)
                      : pipeline::InterleavedOneFOneBSchedule(o.stages, o.micro_batches, o.chunks));
  return layout;
}

StageOptions GptStageOptions(const GptStepOptions& o, int stage) {
  return {.stage = stage,
          .stages = o.stages,
          .chunks = o.chunks,
          .micro_batches = o.micro_batches,
          .dtype = o.dtype,
          .checkpoint_every = o.checkpoint_every,
          .push_every_micro_batch = o.push_every_micro_batch,
          .weight_window_bytes = o.weight_window_bytes};
}

absl::StatusOr<DeviceMemoryPlan> PlanGptStage(const GptStepOptions& o, int stage,
                                              int64_t budget_bytes) {
  ZO_ASSIGN_OR_RETURN(GptStepLayout layout, LayOutGptStep(o));
  ZO_ASSIGN_OR_RETURN(Model model, MakeGpt(o.model));
  ZO_ASSIGN_OR_RETURN(MicroBatch batch,
                      PatternTokenSource(o.batch, o.model.block_size, o.model.vocab).Get(1, 0));
  return PlanDeviceMemory({.model = std::move(model),
                           .bounds = layout.bounds,
                           .options = GptStageOptions(o, stage),
                           .program = layout.programs[stage],
                           .micro_batch = std::move(batch)},
                          budget_bytes);
}

GptStepResult RunGptStep(backend::Backend& backend, const GptStepOptions& o) {
  auto model = MakeGpt(o.model);
  EXPECT_TRUE(model.ok()) << model.status();
  absl::StatusOr<GptStepLayout> layout = LayOutGptStep(o);
  EXPECT_TRUE(layout.ok()) << layout.status();
  if (!model.ok() || !layout.ok()) return {};
  const std::vector<int>& bounds = layout->bounds;
  const std::vector<pipeline::StageProgram>& programs = layout->programs;
  PatternTokenSource source(o.batch, o.model.block_size, o.model.vocab);
  CapturingLink link(backend, o.loss_scale, o.dtype, o.read_host_weights, o.late_weights);
  pipeline::InProcessFabric fabric(o.stages);
  std::vector<std::unique_ptr<ModelStage>> modules;
  std::vector<std::unique_ptr<pipeline::Executor>> executors;
  for (int s = 0; s < o.stages; ++s) {
    auto m = ModelStage::Create(backend, *model, bounds, GptStageOptions(o, s), source, link);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return {};
    modules.push_back(std::move(*m));
    executors.push_back(std::make_unique<pipeline::Executor>(s, o.stages, o.chunks, programs[s],
                                                             *modules.back(), fabric.ForStage(s)));
  }
  std::vector<std::thread> threads;
  std::vector<absl::Status> status(o.stages);
  for (int s = 0; s < o.stages; ++s) {
    threads.emplace_back([&, s] {
      for (int64_t step = 1; step <= o.steps && status[s].ok(); ++step) {
        auto t = executors[s]->RunStep(step);
        status[s] = t.status();
        if (!t.ok()) fabric.Abort(t.status());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& s : status) EXPECT_TRUE(s.ok()) << s;
  GptStepResult result = std::move(link.result());
  result.loss = modules.back()->step_loss();
  for (const auto& m : modules) {
    if (m->window() == nullptr) continue;
    result.peak_window_bytes.push_back(m->window()->peak_resident_bytes());
    result.window_fetches.push_back(m->window()->fetches());
    result.window_prefetches.push_back(m->window()->prefetches());
  }
  return result;
}

}  // namespace zo::model::testing
