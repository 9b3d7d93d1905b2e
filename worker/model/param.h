// One trainable tensor of a model: its name in the job's manifest, its
// shape, how its initial values are drawn, and its memory on the backend.
#ifndef ZO_WORKER_MODEL_PARAM_H_
#define ZO_WORKER_MODEL_PARAM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "worker/backend/tensor.h"

namespace zo::model {

struct ParamInit {
  enum class Kind { kNormal, kUniform, kConstant };
  Kind kind = Kind::kConstant;
  double scale = 0;  // normal: std; uniform: bound (U(-bound, bound)); constant: the value

  static ParamInit Normal(double std) { return {Kind::kNormal, std}; }
  static ParamInit Uniform(double bound) { return {Kind::kUniform, bound}; }
  static ParamInit Constant(double value) { return {Kind::kConstant, value}; }
};

struct Param {
  std::string name;  // "h.0.attn.qkv.weight"
  backend::Shape shape;
  ParamInit init;
  backend::Tensor value;  // the job's dtype; written by each step's pull
  // fp32; micro-batches accumulate into it. With gradients summed on the
  // servers it exists only while one micro-batch's backward passes its layer.
  backend::Tensor grad;

  int64_t numel() const { return backend::NumElements(shape); }
};

// The initial values of `param`: a pure function of (seed, name, element
// index), so a model cut into any number of stages starts from the same
// weights and a test can recompute them.
std::vector<float> InitialValues(const Param& param, uint64_t seed);

}  // namespace zo::model

#endif  // ZO_WORKER_MODEL_PARAM_H_
