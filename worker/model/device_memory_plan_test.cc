// The device memory plan (device_memory_plan.h) against the CPU backend's
// own counts: the dry step holds what the real step holds, and a stage
// given the planned window stays within its budget while computing the
// resident stage's bits, with every schedule.
#include "worker/model/device_memory_plan.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/model.h"
#include "worker/model/param_window.h"
#include "worker/model/testing/gpt_step.h"

namespace zo::model {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::zo::testing::StatusIs;

class DeviceMemoryPlanTest : public ::testing::TestWithParam<testing::ScheduleCase> {
 protected:
  testing::GptStepOptions Options() const {
    return testing::UnderSchedule(
        {.model = {.n_layer = 6, .n_embd = 32, .n_head = 4, .block_size = 8, .vocab = 13},
         .batch = 2,
         .micro_batches = 4,
         .dtype = DType::kBFloat16,
         .push_every_micro_batch = true},
        GetParam());
  }
};

// What the resident stage allocates besides its weights is what the dry
// step planned, but for the 16-bit copy of a gradient the offload link
// makes on the device to push it (the capturing link downloads fp32).
TEST_P(DeviceMemoryPlanTest, TheDryStepHoldsWhatTheCpuBackendHolds) {
  if (GetParam().stages > 1) GTEST_SKIP() << "stages on threads share one backend's count";
  const testing::GptStepOptions options = Options();
  std::unique_ptr<backend::Backend> cpu = backend::MakeCpuBackend();
  (void)testing::RunGptStep(*cpu, options);
  const int64_t held =
      cpu->allocation()->peak_bytes - testing::WeightBytes(options.model, options.dtype);

  ZO_ASSERT_OK_AND_ASSIGN(const DeviceMemoryPlan plan,
                          testing::PlanGptStage(options, 0, int64_t{1} << 40));
  EXPECT_GE(plan.step_bytes, held);
  EXPECT_LE(plan.step_bytes, held + plan.largest_layer_bytes) << "held " << held;
}

TEST_P(DeviceMemoryPlanTest, TheWindowItPlansKeepsTheStepWithinTheBudgetAndItsBits) {
  testing::GptStepOptions options = Options();
  std::unique_ptr<backend::Backend> resident_backend = backend::MakeCpuBackend();
  const testing::GptStepResult resident = testing::RunGptStep(*resident_backend, options);

  // Each stage's least budget, plus a little: its window is its largest
  // layer and the little, fewer bytes than its weights.
  int64_t window = int64_t{1} << 40;
  int64_t budget = 0;
  for (int s = 0; s < options.stages; ++s) {
    ZO_ASSERT_OK_AND_ASSIGN(const DeviceMemoryPlan unbounded,
                            testing::PlanGptStage(options, s, int64_t{1} << 40));
    budget = unbounded.step_bytes + unbounded.largest_layer_bytes + 64;
    ZO_ASSERT_OK_AND_ASSIGN(const DeviceMemoryPlan plan, testing::PlanGptStage(options, s, budget));
    EXPECT_EQ(plan.step_bytes, unbounded.step_bytes);
    EXPECT_EQ(plan.window_bytes, plan.largest_layer_bytes + 64);
    EXPECT_LT(plan.window_bytes, plan.stage_weight_bytes) << "stage " << s << " would not stream";
    window = std::min(window, plan.window_bytes);
  }
  options.weight_window_bytes = window;
  std::unique_ptr<backend::Backend> streaming_backend = backend::MakeCpuBackend();
  const testing::GptStepResult streaming = testing::RunGptStep(*streaming_backend, options);

  EXPECT_EQ(streaming.loss, resident.loss);
  for (const auto& [name, grad] : resident.grads) EXPECT_EQ(streaming.grads.at(name), grad) << name;
  if (options.stages == 1) {
    EXPECT_LE(streaming_backend->allocation()->peak_bytes, budget);
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, DeviceMemoryPlanTest,
                         ::testing::ValuesIn(testing::ScheduleCases()), testing::ScheduleCaseName);

// The measure: weights four times the budget, one stage, losses
// and gradients equal to the resident run's, the peak under the budget.
TEST(DeviceMemoryPlan, WeightsFourTimesTheBudget) {
  testing::GptStepOptions options{
      .model = {.n_layer = 16, .n_embd = 64, .n_head = 4, .block_size = 4, .vocab = 13},
      .batch = 1,
      .micro_batches = 2,
      .checkpoint_every = 4,
      .dtype = DType::kBFloat16,
      .push_every_micro_batch = true};
  const int64_t weights = testing::WeightBytes(options.model, options.dtype);
  const int64_t budget = weights / 4;
  std::unique_ptr<backend::Backend> resident_backend = backend::MakeCpuBackend();
  const testing::GptStepResult resident = testing::RunGptStep(*resident_backend, options);

  ZO_ASSERT_OK_AND_ASSIGN(const DeviceMemoryPlan plan, testing::PlanGptStage(options, 0, budget));
  options.weight_window_bytes = plan.window_bytes;
  std::unique_ptr<backend::Backend> streaming_backend = backend::MakeCpuBackend();
  const testing::GptStepResult streaming = testing::RunGptStep(*streaming_backend, options);

  EXPECT_EQ(streaming.loss, resident.loss);
  for (const auto& [name, grad] : resident.grads) EXPECT_EQ(streaming.grads.at(name), grad) << name;
  EXPECT_LE(streaming_backend->allocation()->peak_bytes, budget)
      << "weights " << weights << " B, step " << plan.step_bytes << " B, window "
      << plan.window_bytes << " B";
}

TEST(DeviceMemoryPlan, ABudgetTooSmallForTheStepAndALayerNamesBoth) {
  const testing::GptStepOptions options{
      .model = {.n_layer = 2, .n_embd = 32, .n_head = 4, .block_size = 8, .vocab = 13},
      .dtype = DType::kBFloat16,
      .push_every_micro_batch = true};
  ZO_ASSERT_OK_AND_ASSIGN(const DeviceMemoryPlan enough,
                          testing::PlanGptStage(options, 0, int64_t{1} << 40));
  EXPECT_EQ(enough.largest_layer, "h.0");
  const int64_t least = enough.step_bytes + enough.largest_layer_bytes;
  ZO_ASSERT_OK_AND_ASSIGN(const DeviceMemoryPlan tight, testing::PlanGptStage(options, 0, least));
  EXPECT_EQ(tight.window_bytes, enough.largest_layer_bytes);
  EXPECT_THAT(
      testing::PlanGptStage(options, 0, least - 1).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("layer h.0 needs " + std::to_string(enough.largest_layer_bytes)),
                     HasSubstr("give at least " + std::to_string(least) + " bytes"))));
  EXPECT_THAT(testing::PlanGptStage(options, 0, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be positive")));
}

}  // namespace
}  // namespace zo::model
