// The GPU benchmark's GPT on one pipeline stage (rows gpu_step and gpu_dpu):
// the model of GpuBenchOptions, its stage module and executor, fed by
// tokens from a fixed hash (GpuBenchToken), so a PyTorch twin can feed the
// same ones. Nothing to learn in them; gpu_largest trains on text instead.
#ifndef ZO_BENCH_INTERNAL_BENCH_GPT_H_
#define ZO_BENCH_INTERNAL_BENCH_GPT_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "bench/gpu_bench.h"
#include "worker/backend/backend.h"
#include "worker/model/model.h"
#include "worker/model/model_stage.h"
#include "worker/pipeline/executor.h"
#include "worker/pipeline/in_process_transport.h"

namespace zo::bench_internal {

class HashTokenSource final : public model::BatchSource {
 public:
  HashTokenSource(int batch, int block, int vocab) : batch_(batch), block_(block), vocab_(vocab) {}
  absl::StatusOr<model::MicroBatch> Get(int64_t step, int micro_batch) override;

 private:
  int batch_, block_, vocab_;
};

// The GPT of the options (n_layer, n_embd, n_head, block_size, vocab).
absl::StatusOr<model::Model> MakeBenchModel(const bench::GpuBenchOptions& options);

class BenchGpt {
 public:
  // `model` from MakeBenchModel; weights and gradients go through `link`.
  static absl::StatusOr<std::unique_ptr<BenchGpt>> Create(const bench::GpuBenchOptions& options,
                                                          backend::Backend& backend,
                                                          model::Model model,
                                                          model::ParamLink& link);

  const model::Model& model() const { return model_; }
  model::ModelStage& stage() { return *stage_; }
  absl::StatusOr<pipeline::StepTimes> RunStep(int64_t step) { return executor_->RunStep(step); }

 private:
  BenchGpt(const bench::GpuBenchOptions& options, model::Model model);

  model::Model model_;
  HashTokenSource source_;
  pipeline::InProcessFabric fabric_{1};
  std::unique_ptr<model::ModelStage> stage_;
  std::unique_ptr<pipeline::Executor> executor_;
};

}  // namespace zo::bench_internal

#endif  // ZO_BENCH_INTERNAL_BENCH_GPT_H_
