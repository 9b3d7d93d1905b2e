#include "worker/model/basic_layers.h"

#include <cmath>

namespace zo::model {

using backend::Backend;
using backend::Tensor;

constexpr float kLayerNormEps = 1e-5f;

EmbeddingLayer::EmbeddingLayer(std::string name, int vocab, int block_size, int dim)
    : Layer(std::move(name), "embedding"), block_size_(block_size) {
  AddParam("wte", {vocab, dim}, ParamInit::Normal(0.02));
  AddParam("wpe", {block_size, dim}, ParamInit::Normal(0.02));
}

Tensor EmbeddingLayer::Forward(Backend& b, const Tensor&, const MicroBatch& mb, Saved&) {
  return b.Embedding(mb.tokens, block_size_, params()[0].value, params()[1].value);
}

Tensor EmbeddingLayer::Backward(Backend& b, const Tensor& dy, const MicroBatch& mb, const Saved&,
                                bool) {
  b.EmbeddingBackward(mb.tokens, block_size_, dy, params()[0].grad, params()[1].grad);
  return Tensor();
}

FeatureInputLayer::FeatureInputLayer(std::string name, int width, DType dtype)
    : Layer(std::move(name), "input"), width_(width), dtype_(dtype) {}

Tensor FeatureInputLayer::Forward(Backend& b, const Tensor&, const MicroBatch& mb, Saved&) {
  Tensor x = b.Empty(dtype_, {mb.rows(), width_});
  // The model checks mb.features' size when it makes the batch.
  (void)b.UploadFloat(mb.features, x);
  return x;
}

Tensor FeatureInputLayer::Backward(Backend&, const Tensor&, const MicroBatch&, const Saved&, bool) {
  return Tensor();
}

LinearLayer::LinearLayer(std::string name, int in, int out)
    : LinearLayer(std::move(name), in, out, ParamInit::Uniform(1 / std::sqrt(double(in))),
                  ParamInit::Uniform(1 / std::sqrt(double(in)))) {}

LinearLayer::LinearLayer(std::string name, int in, int out, ParamInit weight_init,
                         ParamInit bias_init)
    : Layer(std::move(name), "linear") {
  AddParam("weight", {out, in}, weight_init);
  AddParam("bias", {out}, bias_init);
}

Tensor LinearLayer::Forward(Backend& b, const Tensor& x, const MicroBatch&, Saved& saved) {
  saved = {x};
  return b.Linear(x, params()[0].value, params()[1].value);
}

Tensor LinearLayer::Backward(Backend& b, const Tensor& dy, const MicroBatch&, const Saved& saved,
                             bool want_dx) {
  return b.LinearBackward(saved[0], params()[0].value, dy, want_dx, params()[0].grad,
                          &params()[1].grad);
}

Tensor ReluLayer::Forward(Backend& b, const Tensor& x, const MicroBatch&, Saved& saved) {
  saved = {x};
  return b.Relu(x);
}

Tensor ReluLayer::Backward(Backend& b, const Tensor& dy, const MicroBatch&, const Saved& saved,
                           bool want_dx) {
  return want_dx ? b.ReluBackward(saved[0], dy) : Tensor();
}

Tensor GeluLayer::Forward(Backend& b, const Tensor& x, const MicroBatch&, Saved& saved) {
  saved = {x};
  return b.Gelu(x);
}

Tensor GeluLayer::Backward(Backend& b, const Tensor& dy, const MicroBatch&, const Saved& saved,
                           bool want_dx) {
  return want_dx ? b.GeluBackward(saved[0], dy) : Tensor();
}

LayerNormLayer::LayerNormLayer(std::string name, int dim) : Layer(std::move(name), "layernorm") {
  AddParam("weight", {dim}, ParamInit::Constant(1));
  AddParam("bias", {dim}, ParamInit::Constant(0));
}

Tensor LayerNormLayer::Forward(Backend& b, const Tensor& x, const MicroBatch&, Saved& saved) {
  Tensor mean = b.Empty(DType::kFloat32, {x.dim(0)});
  Tensor rstd = b.Empty(DType::kFloat32, {x.dim(0)});
  Tensor y = b.LayerNorm(x, params()[0].value, params()[1].value, kLayerNormEps, mean, rstd);
  saved = {x, mean, rstd};
  return y;
}

Tensor LayerNormLayer::Backward(Backend& b, const Tensor& dy, const MicroBatch&, const Saved& saved,
                                bool) {
  return b.LayerNormBackward(saved[0], params()[0].value, saved[1], saved[2], dy, params()[0].grad,
                             params()[1].grad);
}

}  // namespace zo::model
