// What the executor (executor.h) drives: one pipeline stage's part of the
// model, with its weights, its micro-batch data and its gradient pushes.
//
// The executor owns the order (the stage's program) and the transport; the
// module owns the math and the offload client. Tensors crossing between the
// two are backend tensors, so a CUDA module and the NCCL transport slot in
// without host copies.
#ifndef ZO_WORKER_PIPELINE_STAGE_MODULE_H_
#define ZO_WORKER_PIPELINE_STAGE_MODULE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/backend/tensor.h"

namespace zo::pipeline {

class StageModule {
 public:
  virtual ~StageModule() = default;

  // kPullWeights: makes the weights for `step` current (with DPU possibly an
  // older version; the module's client decides).
  virtual absl::Status BeginStep(int64_t step) = 0;

  // kLoadMicroBatch: stage 0 fetches the inputs of `micro_batch`; the last
  // stage needs the targets too and fetches them on its own in Forward.
  virtual absl::Status LoadMicroBatch(int64_t step, int micro_batch) = 0;

  // kForward of (micro_batch, chunk). `input` is the activation received from
  // the previous virtual stage, undefined on virtual stage 0 (which uses the
  // loaded micro-batch). Returns the activation for the next virtual stage;
  // on the last virtual stage computes the loss and returns an undefined
  // tensor. The module keeps what its backward needs, per micro-batch.
  virtual absl::StatusOr<backend::Tensor> Forward(int micro_batch, int chunk,
                                                  backend::Tensor input) = 0;

  // kBackward of (micro_batch, chunk). `grad_output` is undefined on the last
  // virtual stage (the loss starts the backward). Returns the gradient of the
  // chunk's input, undefined on virtual stage 0. `last_for_chunk`: no other
  // backward of this chunk follows in the step, so each parameter gradient is
  // final as soon as its layer is done and may be pushed while the rest of
  // the backward runs.
  virtual absl::StatusOr<backend::Tensor> Backward(int micro_batch, int chunk,
                                                   backend::Tensor grad_output,
                                                   bool last_for_chunk) = 0;

  // kPushGradients: waits until every gradient of the step is acknowledged
  // by the servers.
  virtual absl::Status FinishStep(int64_t step) = 0;

  // Seconds of this step's Forward and Backward spent waiting for weights
  // that were still arriving (a module whose BeginStep returns before all
  // of them are there): the executor counts them as waiting for weights,
  // not as compute.
  virtual double weights_wait_s() const { return 0; }
};

}  // namespace zo::pipeline

#endif  // ZO_WORKER_PIPELINE_STAGE_MODULE_H_
