// A layer of a model as DeepSpeed's PipelineModule sees it: the unit that
// partitioning assigns to a stage and activation checkpointing groups.
//
// Layers are stateless between calls except for their parameters: what a
// forward needs to keep for its backward goes into the caller's `Saved`, so
// one layer serves several micro-batches in flight (1F1B) and a checkpointed
// segment can recompute it.
#ifndef ZO_WORKER_MODEL_LAYER_H_
#define ZO_WORKER_MODEL_LAYER_H_

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "worker/backend/backend.h"
#include "worker/model/param.h"

namespace zo::model {

// The inputs and targets of one micro-batch. rows = batch * block_size.
struct MicroBatch {
  int batch = 0;                 // sequences (GPT) or samples (MLP)
  int block_size = 1;            // tokens per sequence; 1 for the MLP
  std::vector<int32_t> tokens;   // GPT inputs, [rows]
  std::vector<float> features;   // MLP inputs, [rows, width]
  std::vector<int32_t> targets;  // [rows]

  int64_t rows() const { return int64_t{batch} * block_size; }
};

// What one layer's forward leaves for its backward.
using Saved = std::vector<backend::Tensor>;

class Layer {
 public:
  Layer(std::string name, std::string type) : name_(std::move(name)), type_(std::move(type)) {}
  virtual ~Layer() = default;

  // "h.3"; parameter names start with it.
  const std::string& name() const { return name_; }
  // What `type:REGEX` partitioning matches: "embedding", "block", "linear", ...
  const std::string& type() const { return type_; }

  // In manifest order. A deque, so Param addresses stay put.
  std::deque<Param>& params() { return params_; }
  const std::deque<Param>& params() const { return params_; }
  int64_t param_count() const;

  // Allocates every parameter's value (in `dtype`) unless `values` is false
  // (a streaming stage's window uploads them when the layer computes) and,
  // with `grads`, its fp32 gradient (without: the caller allocates one when
  // it needs it).
  void Bind(backend::Backend& backend, DType dtype, bool grads = true, bool values = true);

  // `x` is the previous layer's output, undefined for a model's first layer
  // (which reads the micro-batch). Returns this layer's output in the
  // activation dtype.
  virtual backend::Tensor Forward(backend::Backend& b, const backend::Tensor& x,
                                  const MicroBatch& mb, Saved& saved) = 0;
  // Accumulates the parameter gradients; returns the gradient of x when
  // want_dx, else an undefined tensor.
  virtual backend::Tensor Backward(backend::Backend& b, const backend::Tensor& dy,
                                   const MicroBatch& mb, const Saved& saved, bool want_dx) = 0;

 protected:
  // Adds "<name>.<suffix>".
  Param& AddParam(const std::string& suffix, backend::Shape shape, ParamInit init);

 private:
  std::string name_;
  std::string type_;
  std::deque<Param> params_;
};

}  // namespace zo::model

#endif  // ZO_WORKER_MODEL_LAYER_H_
