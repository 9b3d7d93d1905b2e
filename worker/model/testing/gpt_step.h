// One training step of GPT-lite through ModelStage and the pipeline executor,
// with the weights from InitialValues and every pushed gradient captured: the
// harness the model tests (any backend) compare runs with.
#ifndef ZO_WORKER_MODEL_TESTING_GPT_STEP_H_
#define ZO_WORKER_MODEL_TESTING_GPT_STEP_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "worker/backend/backend.h"
#include "worker/model/device_memory_plan.h"
#include "worker/model/model.h"
#include "worker/model/model_stage.h"
#include "worker/pipeline/schedule.h"

namespace zo::model::testing {

struct GptStepOptions {
  GptConfig model{.n_layer = 4, .n_embd = 16, .n_head = 2, .block_size = 6, .vocab = 11};
  int batch = 2;
  int stages = 1;
  int chunks = 1;  // virtual stages per stage (interleaved when > 1)
  int micro_batches = 3;
  std::string schedule = "1f1b";  // or "gpipe"
  int checkpoint_every = 0;
  DType dtype = DType::kFloat16;
  double loss_scale = 8;
  bool push_every_micro_batch = false;
  int64_t weight_window_bytes = 0;  // StageOptions::weight_window_bytes
  // Streaming: the link hands its weights as a reader into two slots, as a
  // file or the servers' own copy would, instead of bytes in memory.
  bool read_host_weights = false;
  // Steps 1 .. steps on the same weights; the result's gradients and
  // pushes add up all of them, its loss is the last one's.
  int steps = 1;
  // The link's LoadWeights writes each stage's first param only (NaN into
  // the others) and the rest when AwaitWeights asks for them: weights that
  // arrive while the first layers compute.
  bool late_weights = false;
};

struct GptStepResult {
  double loss = 0;
  // Per stage: the most weight bytes its window held at once, and the
  // layers it uploaded (streaming only).
  std::vector<int64_t> peak_window_bytes;
  std::vector<int64_t> window_fetches;
  std::vector<int64_t> window_prefetches;  // of the fetches, those ahead of use
  // By parameter name, as pushed (summed over micro-batch pushes).
  std::map<std::string, std::vector<float>> grads;
  std::map<std::string, int> pushes;  // how often each was pushed
  std::vector<std::string> order;     // push order
  // late_weights: per stage (its first param's name), how many params each
  // AwaitWeights asked for, in order.
  std::map<std::string, std::vector<size_t>> awaits;
};

// Weights from InitialValues (seed 99, rounded to the dtype); every pushed
// gradient recorded by name, with how often and in which order.
class CapturingLink final : public ParamLink {
 public:
  CapturingLink(backend::Backend& b, double loss_scale = 8, DType dtype = DType::kFloat16,
                bool read_host_weights = false, bool late_weights = false)
      : b_(b),
        loss_scale_(loss_scale),
        dtype_(dtype),
        read_(read_host_weights),
        late_(late_weights) {}
  absl::Status LoadWeights(int64_t step, absl::Span<Param* const> params) override;
  absl::Status AwaitWeights(absl::Span<Param* const> first) override;
  double LossScale(int64_t) override { return loss_scale_; }
  // A micro-batch's gradient (micro_batch >= 0) is added to the others'.
  absl::Status PushGradient(int64_t step, const Param& p, int micro_batch) override;
  absl::Status FinishStep(int64_t) override { return absl::OkStatus(); }
  // The same weights as LoadWeights, as bytes of the params' dtype (or a
  // reader that copies them into a slot of the calling stage's).
  absl::StatusOr<HostWeights> LoadHostWeights(int64_t step,
                                              absl::Span<Param* const> params) override;

  GptStepResult& result() { return result_; }

 private:
  backend::Backend& b_;
  const double loss_scale_;
  const DType dtype_;  // the weights' (LoadHostWeights)
  const bool read_;
  const bool late_;  // GptStepOptions::late_weights
  std::mutex mu_;
  std::set<const Param*> written_;  // late_: params holding the step's weights; guarded by mu_
  GptStepResult result_;
  std::map<const Param*, std::vector<std::byte>> host_;  // guarded by mu_
  // The readers' slots, by the stage's first param and slot; guarded by mu_
  // (a slot's bytes are then only the reading window's).
  std::map<std::pair<const Param*, int>, std::vector<std::byte>> slots_;
};

// Deterministic tokens and targets, different per step and micro-batch.
class PatternTokenSource final : public BatchSource {
 public:
  PatternTokenSource(int batch, int block, int vocab)
      : batch_(batch), block_(block), vocab_(vocab) {}
  absl::StatusOr<MicroBatch> Get(int64_t step, int micro_batch) override;

 private:
  int batch_, block_, vocab_;
};

// Bytes of `config`'s weights in `dtype`.
int64_t WeightBytes(const GptConfig& config, DType dtype);

// The schedules the streaming tests run a step under.
struct ScheduleCase {
  std::string name;
  int stages = 1;
  int chunks = 1;
  std::string schedule = "1f1b";
  int checkpoint_every = 0;
};
// GPipe, 1F1B, two stages, interleaved (2 x 2 chunks) and activation
// checkpointing (every 2 layers).
std::vector<ScheduleCase> ScheduleCases();
// For INSTANTIATE_TEST_SUITE_P.
std::string ScheduleCaseName(const ::testing::TestParamInfo<ScheduleCase>& info);
// `options` run under `schedule`.
GptStepOptions UnderSchedule(GptStepOptions options, const ScheduleCase& schedule);

// The step's cut into (virtual) stages and each stage's program.
struct GptStepLayout {
  std::vector<int> bounds;
  std::vector<pipeline::StageProgram> programs;
};
absl::StatusOr<GptStepLayout> LayOutGptStep(const GptStepOptions& options);
StageOptions GptStageOptions(const GptStepOptions& options, int stage);

// Stage `stage`'s device memory plan for the step RunGptStep runs.
absl::StatusOr<DeviceMemoryPlan> PlanGptStage(const GptStepOptions& options, int stage,
                                              int64_t budget_bytes);

// Steps 1 .. options.steps of the model on `backend` (every stage a thread
// sharing it). Test failures are reported through gtest.
GptStepResult RunGptStep(backend::Backend& backend, const GptStepOptions& options);

}  // namespace zo::model::testing

#endif  // ZO_WORKER_MODEL_TESTING_GPT_STEP_H_
