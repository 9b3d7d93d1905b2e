#include "worker/model/model_stage.h"

#include <chrono>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zo::model {

using backend::Tensor;

absl::Status ParamLink::AwaitWeights(absl::Span<Param* const>) { return absl::OkStatus(); }

absl::StatusOr<HostWeights> ParamLink::LoadHostWeights(int64_t, absl::Span<Param* const>) {
  return absl::UnimplementedError(
      "this link keeps no host copy of the weights: a stage cannot stream its parameters through "
      "it");
}

absl::StatusOr<std::unique_ptr<ModelStage>> ModelStage::Create(
    backend::Backend& backend, Model& model, std::vector<int> bounds, const StageOptions& options,
    BatchSource& source, ParamLink& link) {
  const int virtual_stages = options.stages * options.chunks;
  if (options.stage < 0 || options.stage >= options.stages || options.chunks < 1 ||
      options.micro_batches < 1 || options.checkpoint_every < 0 ||
      options.weight_window_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage ", options.stage, " of ", options.stages, " with ", options.chunks, " chunks, ",
        options.micro_batches, " micro-batches, checkpoint every ", options.checkpoint_every));
  }
  if (static_cast<int>(bounds.size()) != virtual_stages + 1 || bounds.front() != 0 ||
      bounds.back() != static_cast<int>(model.layers.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition has ", bounds.size(), " boundaries for ", virtual_stages,
                     " virtual stages of ", model.layers.size(), " layers"));
  }
  for (int v = 0; v < virtual_stages; ++v) {
    if (bounds[v] >= bounds[v + 1]) {
      return absl::InvalidArgumentError(absl::StrCat("virtual stage ", v, " has no layers"));
    }
  }
  if (options.weight_window_bytes > 0 && !options.push_every_micro_batch) {
    return absl::InvalidArgumentError(
        "streaming a stage's parameters needs each micro-batch's gradients pushed as its "
        "backward makes them (zo.gradient_accumulation \"servers\"): summed on the device they "
        "would keep a gradient of every weight there");
  }
  std::unique_ptr<ModelStage> stage(
      new ModelStage(backend, model, std::move(bounds), options, source, link));
  if (stage->window_ != nullptr) {
    std::vector<const Layer*> layers;
    for (int c = 0; c < options.chunks; ++c) {
      const int v = stage->VirtualStage(c);
      for (int j = stage->bounds_[v]; j < stage->bounds_[v + 1]; ++j) {
        layers.push_back(model.layers[j].get());
      }
    }
    ZO_RETURN_IF_ERROR(stage->window_->CheckFits(layers));
  }
  return stage;
}

ModelStage::ModelStage(backend::Backend& backend, Model& model, std::vector<int> bounds,
                       const StageOptions& options, BatchSource& source, ParamLink& link)
    : backend_(backend),
      model_(model),
      bounds_(std::move(bounds)),
      options_(options),
      source_(source),
      link_(link) {
  const bool streams = options_.weight_window_bytes > 0;
  if (streams) {
    window_ = std::make_unique<ParamWindow>(backend_, options_.dtype, options_.weight_window_bytes);
  }
  // Manifest order is layer order, and a stage's chunks are in layer order.
  for (int c = 0; c < options_.chunks; ++c) {
    const int v = VirtualStage(c);
    for (int j = bounds_[v]; j < bounds_[v + 1]; ++j) {
      Layer& layer = *model_.layers[j];
      layer.Bind(backend_, options_.dtype, /*grads=*/!options_.push_every_micro_batch,
                 /*values=*/!streams);
      for (Param& p : layer.params()) params_.push_back(&p);
      params_through_layer_[j] = params_.size();
    }
  }
}

bool ModelStage::IsLastVirtual(int chunk) const {
  return VirtualStage(chunk) == options_.stages * options_.chunks - 1;
}

bool ModelStage::has_loss() const { return options_.stage == options_.stages - 1; }

absl::Status ModelStage::BeginStep(int64_t step) {
  step_ = step;
  batches_.clear();
  live_.clear();
  losses_.clear();
  weights_ready_ = 0;
  weights_wait_s_ = 0;
  if (window_ != nullptr) {
    ZO_RETURN_IF_ERROR(LoadHostWeights(step));
  } else {
    ZO_RETURN_IF_ERROR(link_.LoadWeights(step, params_));
  }
  // After the load: a delayed update's compensation reads the step
  // before's gradients (OffloadLink::CompensateDelayedSteps). The
  // gradients are not the weights the link may still be writing.
  if (!options_.push_every_micro_batch) {
    for (Param* p : params_) backend_.SetZero(p->grad);
  }
  loss_scale_ = link_.LossScale(step);
  return absl::OkStatus();
}

absl::Status ModelStage::LoadHostWeights(int64_t step) {
  // A prefetch still reading the step before's host copies ends first.
  (void)window_->Settle();
  ZO_ASSIGN_OR_RETURN(HostWeights weights, link_.LoadHostWeights(step, params_));
  if (weights.read != nullptr) {
    window_->Reset(std::move(weights.read), /*unchanged=*/!weights.changed);
    return absl::OkStatus();
  }
  const std::vector<absl::Span<const std::byte>>& host = weights.bytes;
  if (host.size() != params_.size()) {
    return absl::InternalError(absl::StrCat("the link gave host weights for ", host.size(),
                                            " parameters of the stage's ", params_.size()));
  }
  std::map<const Param*, absl::Span<const std::byte>> by_param;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t want = params_[i]->numel() * static_cast<int64_t>(DTypeSize(options_.dtype));
    if (static_cast<int64_t>(host[i].size()) != want) {
      return absl::InternalError(absl::StrCat("host weights of ", params_[i]->name, ": ",
                                              host[i].size(), " bytes, not ", want));
    }
    by_param.emplace(params_[i], host[i]);
  }
  window_->Reset(std::move(by_param), /*unchanged=*/!weights.changed);
  return absl::OkStatus();
}

absl::Status ModelStage::Weights(int j, int next) {
  if (window_ == nullptr) {
    const size_t end = params_through_layer_.at(j);
    if (end <= weights_ready_) return absl::OkStatus();
    const auto start = std::chrono::steady_clock::now();
    absl::Status there = link_.AwaitWeights(absl::MakeConstSpan(params_).first(end));
    weights_wait_s_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ZO_RETURN_IF_ERROR(there);
    weights_ready_ = end;
    return absl::OkStatus();
  }
  ZO_RETURN_IF_ERROR(window_->Fetch(*model_.layers[j]));
  return window_->Prefetch(next < 0 ? nullptr : model_.layers[next].get(), *model_.layers[j]);
}

absl::StatusOr<const MicroBatch*> ModelStage::Batch(int micro_batch) {
  auto it = batches_.find(micro_batch);
  if (it == batches_.end()) {
    ZO_ASSIGN_OR_RETURN(MicroBatch mb, source_.Get(step_, micro_batch));
    it = batches_.emplace(micro_batch, std::move(mb)).first;
  }
  return &it->second;
}

absl::Status ModelStage::LoadMicroBatch(int64_t step, int micro_batch) {
  if (step != step_) {
    return absl::InternalError(
        absl::StrCat("micro-batch load for step ", step, " in step ", step_));
  }
  return Batch(micro_batch).status();
}

absl::StatusOr<Tensor> ModelStage::RunForward(int begin, int end, int first, Tensor x,
                                              const MicroBatch& mb, std::vector<Saved>& saved,
                                              int prefetch_end) {
  for (int j = begin; j < end; ++j) {
    ZO_RETURN_IF_ERROR(Weights(j, j + 1 < prefetch_end ? j + 1 : -1));
    x = model_.layers[j]->Forward(backend_, x, mb, saved[j - first]);
  }
  return x;
}

absl::StatusOr<Tensor> ModelStage::Forward(int micro_batch, int chunk, Tensor input) {
  const int v = VirtualStage(chunk);
  const int begin = bounds_[v];
  const int end = bounds_[v + 1];
  if (begin > 0 && !input.defined()) {
    return absl::InternalError(absl::StrCat("virtual stage ", v, " got no input activation"));
  }
  ZO_ASSIGN_OR_RETURN(const MicroBatch* mb, Batch(micro_batch));
  Live& live = live_[{micro_batch, chunk}];
  live.saved.assign(end - begin, Saved());
  const int k = options_.checkpoint_every;
  Tensor x = std::move(input);
  if (k == 0) {
    ZO_ASSIGN_OR_RETURN(x, RunForward(begin, end, begin, std::move(x), *mb, live.saved, end));
  } else {
    // Keep each run's input; what the run's layers save is dropped here and
    // rebuilt by the backward.
    for (int run = begin; run < end; run += k) {
      live.run_inputs.push_back(x);
      const int run_end = std::min(end, run + k);
      ZO_ASSIGN_OR_RETURN(x, RunForward(run, run_end, begin, std::move(x), *mb, live.saved, end));
      for (int j = run; j < run_end; ++j) live.saved[j - begin].clear();
    }
  }
  // A backend that failed (out of device memory) says so here, not later.
  ZO_RETURN_IF_ERROR(backend_.status());
  if (!IsLastVirtual(chunk)) return x;
  live.logits = x;
  losses_.push_back(backend_.CrossEntropy(x, mb->targets));
  ZO_RETURN_IF_ERROR(backend_.status());
  return Tensor();
}

absl::StatusOr<Tensor> ModelStage::Backward(int micro_batch, int chunk, Tensor grad_output,
                                            bool last_for_chunk) {
  auto it = live_.find({micro_batch, chunk});
  if (it == live_.end()) {
    return absl::InternalError(absl::StrCat("backward of micro-batch ", micro_batch, " chunk ",
                                            chunk, " before its forward"));
  }
  Live& live = it->second;
  ZO_ASSIGN_OR_RETURN(const MicroBatch* mb, Batch(micro_batch));
  const int v = VirtualStage(chunk);
  const int begin = bounds_[v];
  const int end = bounds_[v + 1];
  Tensor dy = std::move(grad_output);
  if (IsLastVirtual(chunk)) {
    // d(loss_scale * mean over micro-batches of the mean loss) / d logits.
    const float scale = static_cast<float>(loss_scale_ / options_.micro_batches);
    dy = backend_.CrossEntropyBackward(live.logits, mb->targets, scale);
    live.logits = Tensor();
  } else if (!dy.defined()) {
    return absl::InternalError(absl::StrCat("virtual stage ", v, " got no output gradient"));
  }
  const int k = options_.checkpoint_every;
  for (int j = end - 1; j >= begin; --j) {
    if (k > 0 && ((j - begin) % k == k - 1 || j == end - 1)) {
      // Recompute the run that ends at j from its saved input.
      const int run = begin + (j - begin) / k * k;
      // The run's last layer computes its backward next: nothing to prefetch.
      ZO_RETURN_IF_ERROR(
          RunForward(run, j + 1, begin, live.run_inputs[(j - begin) / k], *mb, live.saved, j + 1)
              .status());
    }
    ZO_RETURN_IF_ERROR(Weights(j, BackwardNext(j, begin)));
    std::deque<Param>& params = model_.layers[j]->params();
    if (options_.push_every_micro_batch) {
      for (Param& p : params) p.grad = backend_.Zeros(DType::kFloat32, p.shape);
    }
    dy = model_.layers[j]->Backward(backend_, dy, *mb, live.saved[j - begin], j > 0);
    live.saved[j - begin].clear();
    if (options_.push_every_micro_batch) {
      for (Param& p : params) {
        ZO_RETURN_IF_ERROR(link_.PushGradient(step_, p, micro_batch));
        p.grad = Tensor();  // the memory goes back to the backend's pool
      }
    } else if (last_for_chunk) {
      for (const Param& p : params) ZO_RETURN_IF_ERROR(link_.PushGradient(step_, p, -1));
    }
  }
  live_.erase(it);
  ZO_RETURN_IF_ERROR(backend_.status());
  return dy;
}

int ModelStage::BackwardNext(int j, int begin) const {
  if (j - 1 < begin) return -1;
  const int k = options_.checkpoint_every;
  if (k > 0 && (j - 1 - begin) % k == k - 1) return begin + (j - 1 - begin) / k * k;
  return j - 1;
}

absl::Status ModelStage::FinishStep(int64_t step) {
  if (window_ != nullptr) ZO_RETURN_IF_ERROR(window_->Settle());
  ZO_RETURN_IF_ERROR(link_.FinishStep(step));
  if (has_loss()) {
    double sum = 0;
    for (const Tensor& loss : losses_) {
      float value = 0;
      ZO_RETURN_IF_ERROR(backend_.DownloadFloat(loss, absl::MakeSpan(&value, 1)));
      sum += value;
    }
    step_loss_ = losses_.empty() ? std::numeric_limits<double>::quiet_NaN()
                                 : sum / static_cast<double>(losses_.size());
  }
  return absl::OkStatus();
}

}  // namespace zo::model
