// Test-only: a stage module whose math is exact in fp32, so a pipeline's
// loss and gradients can be compared bit for bit with a one-stage run.
//
// Virtual stage v is one layer y = w_v * x (elementwise over a 1 x 4 fp32
// activation); a chunk applies its layers in order. The loss of a
// micro-batch is sum(y) of the last layer. All values are dyadic with few
// significant bits, so every product and sum is exact whatever the order.
#ifndef ZO_WORKER_PIPELINE_TESTING_TOY_STAGE_MODULE_H_
#define ZO_WORKER_PIPELINE_TESTING_TOY_STAGE_MODULE_H_

#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "worker/backend/backend.h"
#include "worker/pipeline/stage_module.h"

namespace zo::pipeline::testing {

inline constexpr int kToyWidth = 4;

inline std::vector<float> ToyWeights(int virtual_stage) {
  std::vector<float> w(kToyWidth);
  for (int i = 0; i < kToyWidth; ++i) w[i] = 0.5f + 0.25f * ((virtual_stage * 3 + i) % 7);
  return w;
}

inline std::vector<float> ToyInput(int micro_batch) {
  std::vector<float> x(kToyWidth);
  for (int i = 0; i < kToyWidth; ++i) x[i] = static_cast<float>(micro_batch + 1) + 0.5f * i;
  return x;
}

struct ToyEvent {
  enum Kind { kBeginStep, kLoad, kForward, kBackward, kFinishStep } kind;
  int micro_batch = 0;
  int chunk = 0;
  bool last_for_chunk = false;
};

class ToyStageModule final : public StageModule {
 public:
  // layers[c]: the virtual stages chunk c applies, in order. `first` and
  // `last`: this module holds virtual stage 0 (in chunk 0) and the last
  // virtual stage (in its last chunk).
  ToyStageModule(backend::Backend& backend, std::vector<std::vector<int>> layers, bool first,
                 bool last)
      : backend_(backend), layers_(std::move(layers)), first_(first), last_(last) {
    for (const auto& chunk : layers_) {
      for (int v : chunk) grads_[v] = std::vector<float>(kToyWidth, 0.0f);
    }
  }

  // Stage `stage` of a pipeline of `stages` x `chunks` virtual stages.
  static std::vector<std::vector<int>> PipelineLayers(int stage, int stages, int chunks) {
    std::vector<std::vector<int>> layers(chunks);
    for (int c = 0; c < chunks; ++c) layers[c] = {c * stages + stage};
    return layers;
  }

  // Forward fails with INTERNAL "injected failure" at this (mb, chunk).
  void FailForwardAt(int micro_batch, int chunk) { fail_at_ = {micro_batch, chunk}; }
  // What weights_wait_s says: seconds of its Forward the module claims it
  // waited for weights.
  void SayWeightsWaited(double seconds) { weights_wait_s_ = seconds; }
  double weights_wait_s() const override { return weights_wait_s_; }

  absl::Status BeginStep(int64_t) override {
    events_.push_back({ToyEvent::kBeginStep});
    return absl::OkStatus();
  }

  absl::Status LoadMicroBatch(int64_t, int micro_batch) override {
    events_.push_back({ToyEvent::kLoad, micro_batch});
    loaded_[micro_batch] = ToyInput(micro_batch);
    return absl::OkStatus();
  }

  absl::StatusOr<backend::Tensor> Forward(int micro_batch, int chunk,
                                          backend::Tensor input) override {
    events_.push_back({ToyEvent::kForward, micro_batch, chunk});
    if (fail_at_ == std::pair{micro_batch, chunk}) return absl::InternalError("injected failure");
    std::vector<float> x;
    if (input.defined()) {
      x.resize(kToyWidth);
      if (absl::Status s = backend_.DownloadFloat(input, absl::MakeSpan(x)); !s.ok()) return s;
    } else {
      if (!first_ || chunk != 0 || !loaded_.count(micro_batch)) {
        return absl::InternalError("no input for a forward");
      }
      x = loaded_[micro_batch];
    }
    std::vector<std::vector<float>>& saved = saved_[{micro_batch, chunk}];
    for (int v : layers_.at(chunk)) {
      saved.push_back(x);
      const std::vector<float> w = ToyWeights(v);
      for (int i = 0; i < kToyWidth; ++i) x[i] *= w[i];
    }
    if (last_ && chunk == static_cast<int>(layers_.size()) - 1) {
      float loss = 0;
      for (float y : x) loss += y;
      losses_[micro_batch] = loss;
      return backend::Tensor();
    }
    return Make(x);
  }

  absl::StatusOr<backend::Tensor> Backward(int micro_batch, int chunk, backend::Tensor grad_output,
                                           bool last_for_chunk) override {
    events_.push_back({ToyEvent::kBackward, micro_batch, chunk, last_for_chunk});
    std::vector<float> dy(kToyWidth, 1.0f);  // d sum(y) / dy
    if (grad_output.defined()) {
      if (absl::Status s = backend_.DownloadFloat(grad_output, absl::MakeSpan(dy)); !s.ok()) {
        return s;
      }
    }
    auto it = saved_.find({micro_batch, chunk});
    if (it == saved_.end()) return absl::InternalError("backward without its forward");
    const std::vector<int>& layers = layers_.at(chunk);
    for (int j = static_cast<int>(layers.size()) - 1; j >= 0; --j) {
      const std::vector<float> w = ToyWeights(layers[j]);
      std::vector<float>& grad = grads_[layers[j]];
      for (int i = 0; i < kToyWidth; ++i) {
        grad[i] += it->second[j][i] * dy[i];
        dy[i] *= w[i];
      }
    }
    saved_.erase(it);
    if (first_ && chunk == 0) return backend::Tensor();
    return Make(dy);
  }

  absl::Status FinishStep(int64_t) override {
    events_.push_back({ToyEvent::kFinishStep});
    return absl::OkStatus();
  }

  const std::vector<ToyEvent>& events() const { return events_; }
  const std::map<int, float>& losses() const { return losses_; }
  const std::map<int, std::vector<float>>& grads() const { return grads_; }

 private:
  backend::Tensor Make(const std::vector<float>& values) {
    backend::Tensor t = backend_.Empty(DType::kFloat32, {1, kToyWidth});
    if (!backend_.UploadFloat(values, t).ok()) return backend::Tensor();
    return t;
  }

  backend::Backend& backend_;
  const std::vector<std::vector<int>> layers_;
  const bool first_;
  const bool last_;
  std::pair<int, int> fail_at_{-1, -1};
  double weights_wait_s_ = 0;
  std::vector<ToyEvent> events_;
  std::map<int, std::vector<float>> loaded_;
  std::map<std::pair<int, int>, std::vector<std::vector<float>>> saved_;
  std::map<int, float> losses_;
  std::map<int, std::vector<float>> grads_;
};

}  // namespace zo::pipeline::testing

#endif  // ZO_WORKER_PIPELINE_TESTING_TOY_STAGE_MODULE_H_
