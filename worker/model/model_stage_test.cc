// A model cut into pipeline stages computes what the uncut model computes:
// the same loss and the same gradients, bit for bit, for every schedule,
// with and without activation checkpointing. And each model layer's
// backward agrees with finite differences of its forward.
#include "worker/model/model_stage.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/basic_layers.h"
#include "worker/model/testing/gpt_step.h"
#include "worker/model/transformer_block.h"

namespace zo::model {
namespace {

using testing::GptStepResult;
using RunResult = GptStepResult;

// One step of GPT-lite (fp16 storage) on `stages` x `chunks` virtual stages.
RunResult RunGpt(int stages, int chunks, int micro_batches, const std::string& schedule,
                 int checkpoint_every) {
  auto backend = backend::MakeCpuBackend({.blas_threads = 1});
  return testing::RunGptStep(*backend, {.stages = stages,
                                        .chunks = chunks,
                                        .micro_batches = micro_batches,
                                        .schedule = schedule,
                                        .checkpoint_every = checkpoint_every});
}

TEST(ModelStageTest, TwoStagesComputeExactlyWhatOneStageComputes) {
  const RunResult one = RunGpt(1, 1, 3, "1f1b", 0);
  ASSERT_TRUE(std::isfinite(one.loss));
  EXPECT_NEAR(one.loss, std::log(11.0), 0.2);  // near-uniform predictions at init
  for (const std::string schedule : {"1f1b", "gpipe"}) {
    const RunResult two = RunGpt(2, 1, 3, schedule, 0);
    EXPECT_EQ(two.loss, one.loss) << schedule;
    EXPECT_EQ(two.grads, one.grads) << schedule;
  }
  const RunResult interleaved = RunGpt(2, 2, 4, "interleaved", 0);
  const RunResult one4 = RunGpt(1, 1, 4, "1f1b", 0);
  EXPECT_EQ(interleaved.loss, one4.loss);
  EXPECT_EQ(interleaved.grads, one4.grads);
}

TEST(ModelStageTest, EveryGradientIsPushedOnceAndIsNonZero) {
  const RunResult r = RunGpt(2, 1, 2, "1f1b", 0);
  auto model = MakeGpt({.n_layer = 4, .n_embd = 16, .n_head = 2, .block_size = 6, .vocab = 11});
  ASSERT_EQ(r.pushes.size(), model->Manifest(DType::kFloat16).size());
  for (const auto& [name, count] : r.pushes) EXPECT_EQ(count, 1) << name;
  // Pushed layer by layer as the last backward passes them (1 stage: the
  // head's first, the embedding's last), not all at the end of the step.
  const RunResult one = RunGpt(1, 1, 2, "1f1b", 0);
  ASSERT_FALSE(one.order.empty());
  EXPECT_EQ(one.order.front(), "lm_head.weight");
  EXPECT_EQ(one.order.back(), "embed.wpe");
  for (const auto& [name, g] : r.grads) {
    double norm = 0;
    for (float x : g) norm += double{x} * x;
    EXPECT_GT(norm, 0) << name;
  }
}

// zo.gradient_accumulation "servers": every micro-batch's gradients are
// pushed on their own, from tensors that exist only during that layer's
// backward, and their sum is the step's gradient. Not bitwise: the device
// path adds micro-batch m into the running sum inside the GEMM (fp32, one
// rounding per add), this one sums separately rounded parts; both are fp32
// sums of 3 terms, so they agree to a few fp32 ulps of the largest term.
TEST(ModelStageTest, PushingEveryMicroBatchSumsToTheStepsGradient) {
  auto backend = backend::MakeCpuBackend({.blas_threads = 1});
  for (const auto& [stages, chunks, micro, schedule] :
       std::vector<std::tuple<int, int, int, std::string>>{
           {1, 1, 3, "1f1b"}, {2, 1, 3, "gpipe"}, {2, 2, 4, "interleaved"}}) {
    const testing::GptStepOptions o{
        .stages = stages, .chunks = chunks, .micro_batches = micro, .schedule = schedule};
    testing::GptStepOptions every = o;
    every.push_every_micro_batch = true;
    const RunResult summed = testing::RunGptStep(*backend, o);
    const RunResult pushed = testing::RunGptStep(*backend, every);
    EXPECT_EQ(pushed.loss, summed.loss) << schedule;
    ASSERT_EQ(pushed.grads.size(), summed.grads.size()) << schedule;
    for (const auto& [name, count] : pushed.pushes) EXPECT_EQ(count, micro) << name;
    for (const auto& [name, g] : summed.grads) {
      const std::vector<float>& h = pushed.grads.at(name);
      ASSERT_EQ(h.size(), g.size()) << name;
      float largest = 0;
      for (float x : g) largest = std::max(largest, std::abs(x));
      for (size_t i = 0; i < g.size(); ++i) {
        ASSERT_NEAR(h[i], g[i], 4 * largest * std::numeric_limits<float>::epsilon())
            << schedule << " " << name << "[" << i << "]";
      }
    }
  }
}

TEST(ModelStageTest, ActivationCheckpointingChangesNothing) {
  const RunResult plain = RunGpt(2, 1, 3, "1f1b", 0);
  for (int k : {1, 2, 5}) {
    const RunResult recomputed = RunGpt(2, 1, 3, "1f1b", k);
    EXPECT_EQ(recomputed.loss, plain.loss) << k;
    EXPECT_EQ(recomputed.grads, plain.grads) << k;
  }
}

// Weights that arrive while the first layers compute (OffloadLink's early
// start): each layer asks for its own before it computes, so the step is
// bit for bit the one whose weights were all there; the first layer waits
// for its own only. Unasked, the NaNs the link leaves would show.
TEST(ModelStageTest, LateWeightsAreAwaitedLayerByLayer) {
  struct Case {
    int stages, chunks, micro_batches;
    std::string schedule;
    int checkpoint_every;
  };
  for (const Case& c : {Case{1, 1, 3, "1f1b", 0}, Case{2, 1, 3, "gpipe", 0},
                        Case{2, 2, 4, "interleaved", 0}, Case{2, 1, 3, "1f1b", 2}}) {
    SCOPED_TRACE(c.schedule + " on " + std::to_string(c.stages) + " stages");
    auto backend = backend::MakeCpuBackend({.blas_threads = 1});
    testing::GptStepOptions o{.stages = c.stages,
                              .chunks = c.chunks,
                              .micro_batches = c.micro_batches,
                              .schedule = c.schedule,
                              .checkpoint_every = c.checkpoint_every};
    const RunResult whole = testing::RunGptStep(*backend, o);
    o.late_weights = true;
    const RunResult late = testing::RunGptStep(*backend, o);
    ASSERT_TRUE(std::isfinite(late.loss));
    EXPECT_EQ(late.loss, whole.loss);
    EXPECT_EQ(late.grads, whole.grads);
    ASSERT_EQ(late.awaits.size(), static_cast<size_t>(c.stages));
    for (const auto& [stage, ends] : late.awaits) {
      EXPECT_TRUE(std::is_sorted(ends.begin(), ends.end())) << stage;
      EXPECT_LT(ends.front(), ends.back()) << stage << ": more than one layer's worth at first";
    }
  }
  // One stage: the embedding's two tables, then a block's params at a time.
  auto backend = backend::MakeCpuBackend({.blas_threads = 1});
  const RunResult one = testing::RunGptStep(*backend, {.micro_batches = 1, .late_weights = true});
  auto model = MakeGpt({.n_layer = 4, .n_embd = 16, .n_head = 2, .block_size = 6, .vocab = 11});
  std::vector<size_t> want;
  size_t end = 0;
  for (const auto& layer : model->layers) want.push_back(end += layer->params().size());
  ASSERT_EQ(one.awaits.size(), 1u);
  EXPECT_EQ(one.awaits.begin()->second, want);
}

// Finite differences through whole layers in fp32 storage: the step h must
// stay well above fp32 resolution, so the tolerance is looser than the
// per-op double-precision checks in worker/backend/cpu/ops_test.cc.
void CheckLayerGradients(Layer& layer, const MicroBatch& mb, int64_t in_features, bool has_input) {
  auto b = backend::MakeCpuBackend({.blas_threads = 1});
  layer.Bind(*b, DType::kFloat32);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0, 1);
  for (Param& p : layer.params()) {
    std::vector<float> v = InitialValues(p, 5);
    for (float& x : v) x += 0.1f * normal(rng);  // break symmetric inits (gamma 1, beta 0)
    ASSERT_TRUE(b->UploadFloat(v, p.value).ok());
  }
  std::vector<float> x(static_cast<size_t>(mb.rows() * in_features));
  for (float& v : x) v = normal(rng);
  backend::Tensor xt;
  if (has_input) {
    xt = b->Empty(DType::kFloat32, {mb.rows(), in_features});
    ASSERT_TRUE(b->UploadFloat(x, xt).ok());
  }
  Saved saved;
  backend::Tensor y = layer.Forward(*b, xt, mb, saved);
  std::vector<float> r(static_cast<size_t>(y.numel()));
  for (float& v : r) v = normal(rng);
  auto loss = [&](const backend::Tensor& input) {
    Saved s;
    backend::Tensor out = layer.Forward(*b, input, mb, s);
    std::vector<float> o(static_cast<size_t>(out.numel()));
    EXPECT_TRUE(b->DownloadFloat(out, absl::MakeSpan(o)).ok());
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += double{o[i]} * r[i];
    return l;
  };
  backend::Tensor dy = b->Empty(DType::kFloat32, y.shape());
  ASSERT_TRUE(b->UploadFloat(r, dy).ok());
  backend::Tensor dx = layer.Backward(*b, dy, mb, saved, has_input);
  const double h = 1e-2;
  auto expect_close = [&](double analytic, double numeric, const std::string& what) {
    EXPECT_NEAR(analytic, numeric, 2e-2 * (1 + std::abs(numeric))) << what;
  };
  if (has_input) {
    std::vector<float> g(x.size());
    ASSERT_TRUE(b->DownloadFloat(dx, absl::MakeSpan(g)).ok());
    for (size_t i = 0; i < x.size(); i += 7) {
      std::vector<float> xp = x, xm = x;
      xp[i] += h;
      xm[i] -= h;
      backend::Tensor tp = b->Empty(DType::kFloat32, xt.shape()),
                      tm = b->Empty(DType::kFloat32, xt.shape());
      ASSERT_TRUE(b->UploadFloat(xp, tp).ok());
      ASSERT_TRUE(b->UploadFloat(xm, tm).ok());
      expect_close(g[i], (loss(tp) - loss(tm)) / (2 * h), "dx[" + std::to_string(i) + "]");
    }
  }
  for (Param& p : layer.params()) {
    std::vector<float> v(static_cast<size_t>(p.numel())), g(v.size());
    ASSERT_TRUE(b->DownloadFloat(p.value, absl::MakeSpan(v)).ok());
    ASSERT_TRUE(b->DownloadFloat(p.grad, absl::MakeSpan(g)).ok());
    for (size_t i = 0; i < v.size(); i += 5) {
      std::vector<float> w = v;
      w[i] = v[i] + h;
      ASSERT_TRUE(b->UploadFloat(w, p.value).ok());
      const double up = loss(xt);
      w[i] = v[i] - h;
      ASSERT_TRUE(b->UploadFloat(w, p.value).ok());
      const double down = loss(xt);
      ASSERT_TRUE(b->UploadFloat(v, p.value).ok());
      expect_close(g[i], (up - down) / (2 * h), p.name + "[" + std::to_string(i) + "]");
    }
  }
}

MicroBatch Tokens(int batch, int block, int vocab) {
  MicroBatch mb;
  mb.batch = batch;
  mb.block_size = block;
  for (int i = 0; i < batch * block; ++i) mb.tokens.push_back((i * 3 + 1) % vocab);
  return mb;
}

TEST(LayerGradientTest, TransformerBlock) {
  TransformerBlock block("h.0", 8, 2, 2);
  CheckLayerGradients(block, Tokens(2, 4, 5), 8, true);
}

TEST(LayerGradientTest, EmbeddingLinearLayerNormActivations) {
  EmbeddingLayer embed("embed", 5, 4, 6);
  CheckLayerGradients(embed, Tokens(2, 4, 5), 0, false);
  LinearLayer linear("fc", 6, 3);
  CheckLayerGradients(linear, Tokens(2, 4, 5), 6, true);
  LayerNormLayer norm("ln", 6);
  CheckLayerGradients(norm, Tokens(2, 4, 5), 6, true);
  GeluLayer gelu("gelu");
  CheckLayerGradients(gelu, Tokens(2, 4, 5), 6, true);
}

TEST(ModelStageTest, RefusesAPartitionThatDoesNotFit) {
  auto backend = backend::MakeCpuBackend();
  auto model = MakeGpt({.n_layer = 2, .n_embd = 8, .n_head = 2, .block_size = 4, .vocab = 5});
  testing::PatternTokenSource source(1, 4, 5);
  testing::CapturingLink link(*backend);
  EXPECT_THAT(ModelStage::Create(*backend, *model, {0, 2, 5}, {.stages = 3}, source, link)
                  .status()
                  .message(),
              ::testing::HasSubstr("3 boundaries for 3 virtual stages"));
  EXPECT_THAT(ModelStage::Create(*backend, *model, {0, 2, 2, 5}, {.stages = 3}, source, link)
                  .status()
                  .message(),
              ::testing::HasSubstr("virtual stage 1 has no layers"));
}

TEST(ModelTest, MlpTaskLabelsAreFloorOfTheSquaredNormModC) {
  MlpConfig c{.width = 8, .depth = 1, .classes = 5};
  MicroBatch mb = MlpMicroBatch(c, 1, 3, 0, 0, 50);
  ASSERT_EQ(mb.features.size(), 400u);
  for (int r = 0; r < 50; ++r) {
    double dot = 0;
    for (int j = 0; j < 8; ++j) {
      const float x = mb.features[r * 8 + j];
      ASSERT_GE(x, 0);
      ASSERT_LT(x, 1);
      dot += double{x} * x;
    }
    EXPECT_EQ(mb.targets[r], static_cast<int>(std::floor(dot)) % 5);
  }
  EXPECT_EQ(MlpMicroBatch(c, 1, 3, 0, 0, 50).features, mb.features);  // a pure function
  EXPECT_NE(MlpMicroBatch(c, 1, 3, 0, 1, 50).features, mb.features);  // per dp rank
}

TEST(ModelTest, GptConfigErrorsNameTheField) {
  EXPECT_THAT(MakeGpt({.n_embd = 10, .n_head = 4}).status().message(),
              ::testing::HasSubstr("n_embd (10) must be a multiple of n_head (4)"));
  EXPECT_THAT(MakeGpt({.n_layer = 0}).status().message(),
              ::testing::HasSubstr("n_layer must be positive"));
}

}  // namespace
}  // namespace zo::model
