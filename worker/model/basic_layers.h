// The simple layers both models are built from: each wraps one backend op
// and its backward.
#ifndef ZO_WORKER_MODEL_BASIC_LAYERS_H_
#define ZO_WORKER_MODEL_BASIC_LAYERS_H_

#include <string>

#include "worker/model/layer.h"

namespace zo::model {

// Token + position embedding: the first layer of GPT-lite (reads mb.tokens).
// Parameters: wte [vocab, dim], wpe [block_size, dim], N(0, 0.02).
class EmbeddingLayer final : public Layer {
 public:
  EmbeddingLayer(std::string name, int vocab, int block_size, int dim);
  backend::Tensor Forward(backend::Backend& b, const backend::Tensor& x, const MicroBatch& mb,
                          Saved& saved) override;
  backend::Tensor Backward(backend::Backend& b, const backend::Tensor& dy, const MicroBatch& mb,
                           const Saved& saved, bool want_dx) override;

 private:
  int block_size_;
};

// The first layer of the MLP: uploads mb.features [rows, width] in the
// activation dtype. No parameters.
class FeatureInputLayer final : public Layer {
 public:
  FeatureInputLayer(std::string name, int width, DType dtype);
  backend::Tensor Forward(backend::Backend& b, const backend::Tensor& x, const MicroBatch& mb,
                          Saved& saved) override;
  backend::Tensor Backward(backend::Backend& b, const backend::Tensor& dy, const MicroBatch& mb,
                           const Saved& saved, bool want_dx) override;

 private:
  int width_;
  DType dtype_;
};

// y = x W^T + b, W [out, in]. Initialised like torch.nn.Linear
// (U(±1/sqrt(in)) for both) unless `init` says otherwise (GPT-2's N(0, std)
// weights and zero biases).
class LinearLayer final : public Layer {
 public:
  LinearLayer(std::string name, int in, int out);
  LinearLayer(std::string name, int in, int out, ParamInit weight_init, ParamInit bias_init);
  backend::Tensor Forward(backend::Backend& b, const backend::Tensor& x, const MicroBatch& mb,
                          Saved& saved) override;
  backend::Tensor Backward(backend::Backend& b, const backend::Tensor& dy, const MicroBatch& mb,
                           const Saved& saved, bool want_dx) override;
};

class ReluLayer final : public Layer {
 public:
  explicit ReluLayer(std::string name) : Layer(std::move(name), "relu") {}
  backend::Tensor Forward(backend::Backend& b, const backend::Tensor& x, const MicroBatch& mb,
                          Saved& saved) override;
  backend::Tensor Backward(backend::Backend& b, const backend::Tensor& dy, const MicroBatch& mb,
                           const Saved& saved, bool want_dx) override;
};

class GeluLayer final : public Layer {
 public:
  explicit GeluLayer(std::string name) : Layer(std::move(name), "gelu") {}
  backend::Tensor Forward(backend::Backend& b, const backend::Tensor& x, const MicroBatch& mb,
                          Saved& saved) override;
  backend::Tensor Backward(backend::Backend& b, const backend::Tensor& dy, const MicroBatch& mb,
                           const Saved& saved, bool want_dx) override;
};

// torch.nn.LayerNorm(dim) with eps 1e-5: gamma 1, beta 0.
class LayerNormLayer final : public Layer {
 public:
  LayerNormLayer(std::string name, int dim);
  backend::Tensor Forward(backend::Backend& b, const backend::Tensor& x, const MicroBatch& mb,
                          Saved& saved) override;
  backend::Tensor Backward(backend::Backend& b, const backend::Tensor& dy, const MicroBatch& mb,
                           const Saved& saved, bool want_dx) override;
};

}  // namespace zo::model

#endif  // ZO_WORKER_MODEL_BASIC_LAYERS_H_
