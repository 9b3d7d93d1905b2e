// A stage that streams its parameters (StageOptions::weight_window_bytes)
// computes bit for bit what the same stage computes with every weight on
// the device, under each schedule and with activation checkpointing, from
// host bytes or read a layer at a time into two slots, while
// its window never holds more than its budget and (one stage) the
// backend's peak allocation falls by the weights it no longer keeps.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/model.h"
#include "worker/model/model_stage.h"
#include "worker/model/param_window.h"
#include "worker/model/testing/gpt_step.h"

namespace zo::model {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::StatusIs;

constexpr GptConfig kModel{.n_layer = 4, .n_embd = 64, .n_head = 4, .block_size = 6, .vocab = 11};

class ParamStreamingTest : public ::testing::TestWithParam<testing::ScheduleCase> {
 protected:
  testing::GptStepOptions Options() const {
    return testing::UnderSchedule({.model = kModel,
                                   .batch = 2,
                                   .micro_batches = 4,
                                   .dtype = DType::kBFloat16,
                                   .push_every_micro_batch = true},
                                  GetParam());
  }
};

TEST_P(ParamStreamingTest, AQuarterOfTheWeightsOnTheDeviceComputesTheSameBits) {
  std::unique_ptr<backend::Backend> resident_backend = backend::MakeCpuBackend();
  const testing::GptStepResult resident = testing::RunGptStep(*resident_backend, Options());
  const int64_t resident_peak = resident_backend->allocation()->peak_bytes;

  testing::GptStepOptions streaming_options = Options();
  const int64_t weights = testing::WeightBytes(kModel, DType::kBFloat16);
  streaming_options.weight_window_bytes = weights / 4;
  std::unique_ptr<backend::Backend> streaming_backend = backend::MakeCpuBackend();
  const testing::GptStepResult streaming =
      testing::RunGptStep(*streaming_backend, streaming_options);
  const int64_t streaming_peak = streaming_backend->allocation()->peak_bytes;

  EXPECT_EQ(streaming.loss, resident.loss);
  ASSERT_EQ(streaming.grads.size(), resident.grads.size());
  for (const auto& [name, grad] : resident.grads) {
    EXPECT_EQ(streaming.grads.at(name), grad) << name;
    EXPECT_EQ(streaming.pushes.at(name), resident.pushes.at(name)) << name;
  }
  // Read a layer at a time into two slots (a file, the servers' copy),
  // with the prefetch's read beside the compute: the same bits again.
  streaming_options.read_host_weights = true;
  std::unique_ptr<backend::Backend> read_backend = backend::MakeCpuBackend();
  const testing::GptStepResult read = testing::RunGptStep(*read_backend, streaming_options);
  EXPECT_EQ(read.loss, resident.loss);
  EXPECT_EQ(read.grads, resident.grads);
  EXPECT_EQ(read.window_fetches, streaming.window_fetches);

  const int windows = GetParam().stages;
  ASSERT_EQ(static_cast<int>(streaming.peak_window_bytes.size()), windows);
  for (int s = 0; s < windows; ++s) {
    EXPECT_LE(streaming.peak_window_bytes[s], weights / 4) << "stage " << s;
    EXPECT_GT(streaming.peak_window_bytes[s], 0) << "stage " << s;
  }
  // The small layers (embedding, final norm, head) fit beside a block, so
  // some uploads went ahead of their use: those bits are the same too.
  int64_t prefetches = 0;
  for (int64_t p : streaming.window_prefetches) prefetches += p;
  EXPECT_GT(prefetches, 0);
  // One stage allocates in the same order in both runs, but for the
  // weights: every weight byte beyond the window is one the device no
  // longer holds at the peak. (Stages on threads sharing the backend
  // interleave their activations differently from run to run, so their
  // joint peak moves by more than the weights.)
  if (windows == 1) {
    EXPECT_LE(streaming_peak, resident_peak - weights + weights / 4)
        << "resident " << resident_peak << " B, streaming " << streaming_peak << " B";
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, ParamStreamingTest,
                         ::testing::ValuesIn(testing::ScheduleCases()), testing::ScheduleCaseName);

// From its second step the window drops the layer needed furthest ahead in
// the order the first step fetched them: under GPipe, whose forward sweeps
// repeat, a third fewer uploads than the least recently used rule's (which
// drops the very next layer needed), and still the same bits; and it
// prefetches the next layer of that order.
TEST(ParamStreamingOrder, FromTheSecondStepGPipeUploadsAThirdLess) {
  testing::GptStepOptions options{
      .model = {.n_layer = 12, .n_embd = 64, .n_head = 4, .block_size = 6, .vocab = 11},
      .batch = 2,
      .micro_batches = 8,
      .schedule = "gpipe",
      .dtype = DType::kBFloat16,
      .push_every_micro_batch = true,
      .steps = 2};
  std::unique_ptr<backend::Backend> resident_backend = backend::MakeCpuBackend();
  const testing::GptStepResult resident = testing::RunGptStep(*resident_backend, options);

  options.weight_window_bytes = testing::WeightBytes(options.model, DType::kBFloat16) / 2;
  std::unique_ptr<backend::Backend> backend = backend::MakeCpuBackend();
  const testing::GptStepResult two = testing::RunGptStep(*backend, options);
  options.steps = 1;
  const testing::GptStepResult one = testing::RunGptStep(*backend, options);

  EXPECT_EQ(two.loss, resident.loss);
  EXPECT_EQ(two.grads, resident.grads);
  const int64_t first = one.window_fetches[0];
  const int64_t second = two.window_fetches[0] - first;
  EXPECT_LT(second, first * 7 / 10) << "first step " << first << ", second " << second;
  // And the order names the next layer across micro-batches too: every
  // upload but the step's first starts while the layer before computes.
  const int64_t prefetched = two.window_prefetches[0] - one.window_prefetches[0];
  EXPECT_GE(prefetched, second - 1) << "of " << second;
}

// One stage over the whole of GPT-lite on the CPU backend, for the refusals.
class ParamStreamingRefusals : public ::testing::Test {
 protected:
  absl::StatusOr<std::unique_ptr<ModelStage>> Stage(const StageOptions& options, ParamLink& link) {
    return ModelStage::Create(*backend_, model_, {0, static_cast<int>(model_.layers.size())},
                              options, source_, link);
  }

  std::unique_ptr<backend::Backend> backend_ = backend::MakeCpuBackend();
  Model model_ = *MakeGpt(kModel);
  testing::PatternTokenSource source_{2, kModel.block_size, kModel.vocab};
  testing::CapturingLink link_{*backend_};
};

TEST_F(ParamStreamingRefusals, AWindowSmallerThanALayerNamesTheLayer) {
  const int64_t block = ParamWindow::LayerBytes(*model_.layers[1], DType::kBFloat16);
  EXPECT_THAT(Stage({.dtype = DType::kBFloat16,
                     .push_every_micro_batch = true,
                     .weight_window_bytes = block - 1},
                    link_)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layer h.0 needs ")));
}

TEST_F(ParamStreamingRefusals, GradientsSummedOnTheDeviceCannotStream) {
  EXPECT_THAT(
      Stage({.dtype = DType::kBFloat16, .weight_window_bytes = int64_t{1} << 30}, link_).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("zo.gradient_accumulation \"servers\"")));
}

TEST_F(ParamStreamingRefusals, ALinkWithoutHostWeightsSaysSo) {
  // A link that only writes weights into the params (the default).
  class DeviceOnlyLink final : public ParamLink {
   public:
    absl::Status LoadWeights(int64_t, absl::Span<Param* const>) override {
      return absl::OkStatus();
    }
    double LossScale(int64_t) override { return 1; }
    absl::Status PushGradient(int64_t, const Param&, int) override { return absl::OkStatus(); }
    absl::Status FinishStep(int64_t) override { return absl::OkStatus(); }
  };
  DeviceOnlyLink link;
  absl::StatusOr<std::unique_ptr<ModelStage>> stage =
      Stage({.dtype = DType::kBFloat16,
             .push_every_micro_batch = true,
             .weight_window_bytes = int64_t{1} << 30},
            link);
  ASSERT_TRUE(stage.ok()) << stage.status();
  EXPECT_THAT((*stage)->BeginStep(1),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("no host copy")));
}

}  // namespace
}  // namespace zo::model
