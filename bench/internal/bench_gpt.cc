#include "bench/internal/bench_gpt.h"

#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "worker/model/partition.h"
#include "worker/pipeline/schedule.h"

namespace zo::bench_internal {

absl::StatusOr<model::MicroBatch> HashTokenSource::Get(int64_t step, int micro_batch) {
  model::MicroBatch mb;
  mb.batch = batch_;
  mb.block_size = block_;
  const int64_t n = int64_t{batch_} * block_;
  for (int64_t i = 0; i < n; ++i) {
    mb.tokens.push_back(bench::GpuBenchToken(step, micro_batch, i, vocab_));
    mb.targets.push_back(bench::GpuBenchToken(step, micro_batch, i + 1, vocab_));
  }
  return mb;
}

absl::StatusOr<model::Model> MakeBenchModel(const bench::GpuBenchOptions& o) {
  return model::MakeGpt({.n_layer = o.n_layer,
                         .n_embd = o.n_embd,
                         .n_head = o.n_head,
                         .block_size = o.block_size,
                         .vocab = o.vocab});
}

BenchGpt::BenchGpt(const bench::GpuBenchOptions& o, model::Model model)
    : model_(std::move(model)), source_(o.batch, o.block_size, o.vocab) {}

absl::StatusOr<std::unique_ptr<BenchGpt>> BenchGpt::Create(const bench::GpuBenchOptions& o,
                                                           backend::Backend& backend,
                                                           model::Model model,
                                                           model::ParamLink& link) {
  std::unique_ptr<BenchGpt> gpt(new BenchGpt(o, std::move(model)));
  std::vector<model::LayerWeightInfo> infos;
  for (const auto& l : gpt->model_.layers) infos.push_back({l->type(), l->param_count()});
  ZO_ASSIGN_OR_RETURN(std::vector<int> bounds, model::PartitionLayers(infos, 1, "uniform"));
  ZO_ASSIGN_OR_RETURN(auto programs, pipeline::OneFOneBSchedule(1, o.micro_batches));
  ZO_ASSIGN_OR_RETURN(gpt->stage_, model::ModelStage::Create(backend, gpt->model_, bounds,
                                                             {.stage = 0,
                                                              .stages = 1,
                                                              .chunks = 1,
                                                              .micro_batches = o.micro_batches,
                                                              .dtype = o.dtype},
                                                             gpt->source_, link));
  gpt->executor_ = std::make_unique<pipeline::Executor>(0, 1, 1, programs[0], *gpt->stage_,
                                                        gpt->fabric_.ForStage(0));
  return gpt;
}

}  // namespace zo::bench_internal
