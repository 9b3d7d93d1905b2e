// GPT-lite on the CUDA backend: a step follows the CPU backend's (the
// reference) within fp16 tolerance, and pipeline stages on the GPU compute
// bit for bit what one stage computes.
//
// Tolerance: each op rounds its output once to fp16 (2^-11 relative, half an
// ulp) and the two backends round differently only where fp32 sum orders
// differ, so a gradient gathers at most a few such flips per op on its path
// through the model's ~40 ops. Their effect on a whole tensor's norm is far
// below 2^-10 x 40 ~ 4e-2; we allow 1e-2 of the norm, and 1e-3 on the loss.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/model/testing/gpt_step.h"

namespace zo::model {
namespace {

using testing::GptStepOptions;
using testing::GptStepResult;

class GpuModelStageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (backend::CudaDeviceCount(&why) == 0) {
      GTEST_SKIP() << "no CUDA device (" << why << "); these run on a GPU machine: ctest -L gpu";
    }
    auto gpu = backend::MakeCudaBackend({.device = 0, .deterministic = true});
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(*gpu);
  }
  std::unique_ptr<backend::Backend> gpu_;
};

double RelativeDistance(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    norm += double{b[i]} * b[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

TEST_F(GpuModelStageTest, FollowsTheCpuBackend) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    // bf16 keeps 3 fewer mantissa bits than fp16: 8x the tolerance.
    const double scale = dtype == DType::kFloat16 ? 1 : 8;
    const GptStepOptions options{
        .model = {.n_layer = 2, .n_embd = 64, .n_head = 4, .block_size = 32, .vocab = 65},
        .batch = 4,
        .micro_batches = 2,
        .dtype = dtype};
    auto cpu = backend::MakeCpuBackend({.blas_threads = 1});
    const GptStepResult want = testing::RunGptStep(*cpu, options);
    const GptStepResult got = testing::RunGptStep(*gpu_, options);
    ASSERT_TRUE(std::isfinite(want.loss));
    EXPECT_NEAR(got.loss, want.loss, 1e-3 * scale * want.loss) << dtype;
    ASSERT_EQ(got.grads.size(), want.grads.size());
    for (const auto& [name, g] : want.grads) {
      ASSERT_TRUE(got.grads.contains(name)) << name;
      ASSERT_EQ(got.grads.at(name).size(), g.size()) << name;
      EXPECT_LT(RelativeDistance(got.grads.at(name), g), 1e-2 * scale) << dtype << " " << name;
    }
  }
}

TEST_F(GpuModelStageTest, TwoStagesComputeExactlyWhatOneStageComputes) {
  const GptStepResult one = testing::RunGptStep(*gpu_, {.stages = 1, .micro_batches = 3});
  ASSERT_TRUE(std::isfinite(one.loss));
  for (const std::string schedule : {"1f1b", "gpipe"}) {
    const GptStepResult two =
        testing::RunGptStep(*gpu_, {.stages = 2, .micro_batches = 3, .schedule = schedule});
    EXPECT_EQ(two.loss, one.loss) << schedule;
    EXPECT_EQ(two.grads, one.grads) << schedule;
  }
  const GptStepResult recomputed =
      testing::RunGptStep(*gpu_, {.stages = 2, .micro_batches = 3, .checkpoint_every = 1});
  EXPECT_EQ(recomputed.loss, one.loss);
  EXPECT_EQ(recomputed.grads, one.grads);
}

// zo.gradient_accumulation "servers" on the GPU: every layer's gradients
// are allocated for one micro-batch's backward and released right after its
// push (stream-ordered), and the micro-batch pushes sum to the step's
// gradients. fp32 sums of 3 parts in a different order: a few fp32 ulps of
// the gradient's norm.
TEST_F(GpuModelStageTest, MicroBatchPushesSumToTheStepsGradients) {
  const GptStepOptions options{.stages = 2, .micro_batches = 3};
  GptStepOptions every = options;
  every.push_every_micro_batch = true;
  const GptStepResult summed = testing::RunGptStep(*gpu_, options);
  const GptStepResult pushed = testing::RunGptStep(*gpu_, every);
  EXPECT_EQ(pushed.loss, summed.loss);
  ASSERT_EQ(pushed.grads.size(), summed.grads.size());
  for (const auto& [name, g] : summed.grads) {
    EXPECT_EQ(pushed.pushes.at(name), 3) << name;
    EXPECT_LT(RelativeDistance(pushed.grads.at(name), g), 1e-5) << name;
  }
}

// Parameter streaming on the GPU: a window the device memory plan gives
// for a budget a little above the least computes the resident stage's bits,
// and (one stage) the device holds no more than the budget at its peak and
// what the plan's dry step held besides the weights.
TEST_F(GpuModelStageTest, StreamingInThePlannedWindowComputesTheResidentBits) {
  struct Case {
    std::string schedule;
    int stages;
    int checkpoint_every;
  };
  for (const Case& c :
       {Case{"1f1b", 1, 0}, Case{"gpipe", 1, 0}, Case{"1f1b", 1, 2}, Case{"1f1b", 2, 0}}) {
    GptStepOptions options{
        .model = {.n_layer = 4, .n_embd = 64, .n_head = 4, .block_size = 16, .vocab = 65},
        .batch = 2,
        .stages = c.stages,
        .micro_batches = 3,
        .schedule = c.schedule,
        .checkpoint_every = c.checkpoint_every,
        .dtype = DType::kBFloat16,
        .push_every_micro_batch = true};
    const std::string what = c.schedule + " x" + std::to_string(c.stages) + " checkpoint " +
                             std::to_string(c.checkpoint_every);
    gpu_->ResetPeakAllocation();
    const int64_t before = gpu_->allocation()->live_bytes;
    const GptStepResult resident = testing::RunGptStep(*gpu_, options);
    const int64_t resident_peak = gpu_->allocation()->peak_bytes - before;

    int64_t window = int64_t{1} << 40;
    int64_t budget = 0;
    for (int s = 0; s < c.stages; ++s) {
      auto unbounded = testing::PlanGptStage(options, s, int64_t{1} << 40);
      ASSERT_TRUE(unbounded.ok()) << unbounded.status();
      budget = unbounded->step_bytes + unbounded->largest_layer_bytes + 64;
      auto plan = testing::PlanGptStage(options, s, budget);
      ASSERT_TRUE(plan.ok()) << plan.status();
      window = std::min(window, plan->window_bytes);
      if (c.stages == 1) {
        const int64_t weights = plan->stage_weight_bytes;
        EXPECT_GE(plan->step_bytes, resident_peak - weights) << what;
        EXPECT_LE(plan->step_bytes, resident_peak - weights + plan->largest_layer_bytes) << what;
      }
    }
    options.weight_window_bytes = window;
    gpu_->ResetPeakAllocation();
    const GptStepResult streamed = testing::RunGptStep(*gpu_, options);
    const int64_t streamed_peak = gpu_->allocation()->peak_bytes - before;
    EXPECT_EQ(streamed.loss, resident.loss) << what;
    EXPECT_EQ(streamed.grads, resident.grads) << what;
    if (c.stages == 1) {
      EXPECT_LE(streamed_peak, budget) << what;
    }
    // Read a layer at a time into two slots (a file, the servers' copy):
    // the prefetch's read and its uploads start on the window's reader
    // thread.
    options.read_host_weights = true;
    const GptStepResult read = testing::RunGptStep(*gpu_, options);
    EXPECT_EQ(read.loss, resident.loss) << what << ", read";
    EXPECT_EQ(read.grads, resident.grads) << what << ", read";
  }
}

}  // namespace
}  // namespace zo::model
