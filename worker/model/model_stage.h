// One pipeline stage of a model: the layers of its virtual stages, run by the
// executor (worker/pipeline/executor.h) through the StageModule interface.
//
// Weights come from and gradients go to a ParamLink (the offload servers in
// zo-train); micro-batches from a BatchSource. With activation
// checkpointing every k layers, the forward keeps only the input of each run
// of k layers and the backward recomputes the run before going through it.
// When a chunk's last backward of the step passes a layer, that layer's
// gradients are final and go to the link at once, while the rest of the
// backward still runs.
#ifndef ZO_WORKER_MODEL_MODEL_STAGE_H_
#define ZO_WORKER_MODEL_MODEL_STAGE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/backend/backend.h"
#include "worker/model/model.h"
#include "worker/model/param_window.h"
#include "worker/pipeline/stage_module.h"

namespace zo::model {

// What ParamLink::LoadHostWeights hands over.
struct HostWeights {
  // One span of bytes in the params' dtype per param, in order, valid until
  // the next call.
  std::vector<absl::Span<const std::byte>> bytes;
  // Instead of `bytes` (then empty): weights the link keeps in a file
  // (offload_param "nvme"), which the window reads a layer at a time.
  HostWeightReader read;
  // False when these are the very bytes of the call before, unchanged (a
  // pull that found the same version): the stage keeps the layers it has on
  // the device.
  bool changed = true;
};

class ParamLink {
 public:
  virtual ~ParamLink() = default;
  // Writes the weights to compute `step` with into every param's value.
  // A link may return while the later params' values still arrive (the
  // next step's first layers then start early): a caller reads a param's
  // value only after AwaitWeights covers it.
  virtual absl::Status LoadWeights(int64_t step, absl::Span<Param* const> params) = 0;
  // `first`, the params LoadWeights got up to some layer's last, hold the
  // step's weights (waits for them). A stage asks before each layer
  // computes: layers are in params' order. The default is for a link whose
  // LoadWeights writes every value itself.
  virtual absl::Status AwaitWeights(absl::Span<Param* const> first);
  // The loss scale of `step`'s gradients (1 without fp16); asked after
  // LoadWeights.
  virtual double LossScale(int64_t step) = 0;
  // param.grad (fp32, loss-scaled) is final: summed over the step's
  // micro-batches (micro_batch < 0), or micro-batch `micro_batch`'s alone
  // when StageOptions::push_every_micro_batch. The link is done with
  // param.grad when this returns (a copy may still be in flight).
  virtual absl::Status PushGradient(int64_t step, const Param& param, int micro_batch) = 0;
  // Every gradient of `step` is acknowledged.
  virtual absl::Status FinishStep(int64_t step) = 0;
  // Parameter streaming (StageOptions::weight_window_bytes), instead of
  // LoadWeights: the weights to compute `step` with, left in host memory.
  // UNIMPLEMENTED by a link that keeps no host copy.
  virtual absl::StatusOr<HostWeights> LoadHostWeights(int64_t step,
                                                      absl::Span<Param* const> params);
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual absl::StatusOr<MicroBatch> Get(int64_t step, int micro_batch) = 0;
};

struct StageOptions {
  int stage = 0;
  int stages = 1;
  int chunks = 1;  // virtual stages per stage (interleaved 1F1B)
  int micro_batches = 1;
  DType dtype = DType::kFloat32;  // weights and activations
  int checkpoint_every = 0;       // layers per recomputed run; 0: keep everything
  // zo.gradient_accumulation "servers": no gradient tensors kept; each
  // micro-batch's gradients go to the link as the backward passes their
  // layer (with one micro-batch this equals the default, minus the memory).
  bool push_every_micro_batch = false;
  // Parameter streaming: at most this many bytes of the stage's weights on
  // the device at once, whole layers, uploaded from the link's host copy as
  // each layer computes (param_window.h); 0: every weight stays on the
  // device. Needs push_every_micro_batch, so that no gradient outlives its
  // layer's backward.
  int64_t weight_window_bytes = 0;
};

class ModelStage final : public pipeline::StageModule {
 public:
  // `bounds` cuts model.layers into stages * chunks virtual stages (see
  // partition.h); virtual stage c * stages + s runs on stage s as chunk c.
  // Binds this stage's parameters on `backend`. The model, backend, source
  // and link must outlive the stage.
  static absl::StatusOr<std::unique_ptr<ModelStage>> Create(backend::Backend& backend, Model& model,
                                                            std::vector<int> bounds,
                                                            const StageOptions& options,
                                                            BatchSource& source, ParamLink& link);

  absl::Status BeginStep(int64_t step) override;
  absl::Status LoadMicroBatch(int64_t step, int micro_batch) override;
  absl::StatusOr<backend::Tensor> Forward(int micro_batch, int chunk,
                                          backend::Tensor input) override;
  absl::StatusOr<backend::Tensor> Backward(int micro_batch, int chunk, backend::Tensor grad_output,
                                           bool last_for_chunk) override;
  absl::Status FinishStep(int64_t step) override;

  // This stage's parameters, in manifest order.
  absl::Span<Param* const> params() const { return params_; }
  // Whether this stage computes the loss (holds the last virtual stage).
  bool has_loss() const;
  // Mean loss over the micro-batches of the last finished step (unscaled);
  // meaningful only when has_loss().
  double step_loss() const { return step_loss_; }
  // The streaming window; null when every weight stays on the device.
  const ParamWindow* window() const { return window_.get(); }
  // Seconds this step's Forward and Backward waited for weights still
  // arriving from the link (ParamLink::AwaitWeights).
  double weights_wait_s() const override { return weights_wait_s_; }

 private:
  struct Live {  // one (micro-batch, chunk) between its forward and backward
    std::vector<backend::Tensor> run_inputs;  // checkpointing: input of each run
    std::vector<Saved> saved;                 // per layer; empty for dropped runs
    backend::Tensor logits;                   // last virtual stage
  };

  ModelStage(backend::Backend& backend, Model& model, std::vector<int> bounds,
             const StageOptions& options, BatchSource& source, ParamLink& link);

  int VirtualStage(int chunk) const { return chunk * options_.stages + options_.stage; }
  bool IsLastVirtual(int chunk) const;
  absl::StatusOr<const MicroBatch*> Batch(int micro_batch);
  // Forward of layers [begin, end) of the model from x, filling saved[j - first];
  // streaming prefetches layer j + 1 while j computes if j + 1 < prefetch_end.
  absl::StatusOr<backend::Tensor> RunForward(int begin, int end, int first, backend::Tensor x,
                                             const MicroBatch& mb, std::vector<Saved>& saved,
                                             int prefetch_end);
  // Layer j's weights are on the device (streaming: the window fetches
  // them, and starts uploading layer `next`'s unless it is -1; else the
  // link has them there, waiting for those still arriving).
  absl::Status Weights(int j, int next);
  // The layer the backward computes after layer j's, in the chunk whose
  // first layer is `begin`: j - 1, or with checkpointing the first of the
  // run that j - 1 ends (recomputed first); -1 after the chunk's first.
  int BackwardNext(int j, int begin) const;
  // Streaming: the window gets the step's host copies of the weights.
  absl::Status LoadHostWeights(int64_t step);

  backend::Backend& backend_;
  Model& model_;
  std::vector<int> bounds_;
  StageOptions options_;
  BatchSource& source_;
  ParamLink& link_;
  std::vector<Param*> params_;
  std::unique_ptr<ParamWindow> window_;  // streaming only
  // Per model layer of this stage: how many of params_ its last param
  // ends (what AwaitWeights asks for before it computes).
  std::map<int, size_t> params_through_layer_;
  size_t weights_ready_ = 0;  // of params_, this step: known to be there
  double weights_wait_s_ = 0;

  int64_t step_ = -1;
  double loss_scale_ = 1;
  std::map<int, MicroBatch> batches_;
  std::map<std::pair<int, int>, Live> live_;
  std::vector<backend::Tensor> losses_;
  double step_loss_ = 0;
};

}  // namespace zo::model

#endif  // ZO_WORKER_MODEL_MODEL_STAGE_H_
