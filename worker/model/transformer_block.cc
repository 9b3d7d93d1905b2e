#include "worker/model/transformer_block.h"

#include <cmath>

namespace zo::model {

using backend::Backend;
using backend::Tensor;

namespace {

constexpr float kEps = 1e-5f;

// Parameter order (the manifest's order inside a block).
enum : int { kLn1W, kLn1B, kQkvW, kQkvB, kProjW, kProjB, kLn2W, kLn2B, kFcW, kFcB, kFc2W, kFc2B };

// What Forward saves, by position.
enum : int { kX, kMean1, kRstd1, kH1, kQkv, kLse, kAtt, kX2, kMean2, kRstd2, kH2, kF, kG, kSaved };

}  // namespace

TransformerBlock::TransformerBlock(std::string name, int dim, int heads, int n_layer)
    : Layer(std::move(name), "block"), heads_(heads) {
  const ParamInit w = ParamInit::Normal(0.02);
  const ParamInit w_residual = ParamInit::Normal(0.02 / std::sqrt(2.0 * n_layer));
  const ParamInit zero = ParamInit::Constant(0);
  AddParam("ln_1.weight", {dim}, ParamInit::Constant(1));
  AddParam("ln_1.bias", {dim}, zero);
  AddParam("attn.qkv.weight", {3 * dim, dim}, w);
  AddParam("attn.qkv.bias", {3 * dim}, zero);
  AddParam("attn.proj.weight", {dim, dim}, w_residual);
  AddParam("attn.proj.bias", {dim}, zero);
  AddParam("ln_2.weight", {dim}, ParamInit::Constant(1));
  AddParam("ln_2.bias", {dim}, zero);
  AddParam("mlp.fc.weight", {4 * dim, dim}, w);
  AddParam("mlp.fc.bias", {4 * dim}, zero);
  AddParam("mlp.proj.weight", {dim, 4 * dim}, w_residual);
  AddParam("mlp.proj.bias", {dim}, zero);
}

Tensor TransformerBlock::Forward(Backend& b, const Tensor& x, const MicroBatch& mb, Saved& s) {
  auto& p = params();
  s.assign(kSaved, Tensor());
  const int64_t rows = x.dim(0);
  s[kX] = x;
  s[kMean1] = b.Empty(DType::kFloat32, {rows});
  s[kRstd1] = b.Empty(DType::kFloat32, {rows});
  s[kH1] = b.LayerNorm(x, p[kLn1W].value, p[kLn1B].value, kEps, s[kMean1], s[kRstd1]);
  s[kQkv] = b.Linear(s[kH1], p[kQkvW].value, p[kQkvB].value);
  const int64_t t = mb.block_size;
  s[kLse] = b.Empty(DType::kFloat32, {mb.batch, heads_, t});
  s[kAtt] = b.Attention(s[kQkv], mb.batch, heads_, s[kLse]);
  s[kX2] = b.Add(x, b.Linear(s[kAtt], p[kProjW].value, p[kProjB].value));
  s[kMean2] = b.Empty(DType::kFloat32, {rows});
  s[kRstd2] = b.Empty(DType::kFloat32, {rows});
  s[kH2] = b.LayerNorm(s[kX2], p[kLn2W].value, p[kLn2B].value, kEps, s[kMean2], s[kRstd2]);
  s[kF] = b.Linear(s[kH2], p[kFcW].value, p[kFcB].value);
  s[kG] = b.Gelu(s[kF]);
  return b.Add(s[kX2], b.Linear(s[kG], p[kFc2W].value, p[kFc2B].value));
}

Tensor TransformerBlock::Backward(Backend& b, const Tensor& dy, const MicroBatch& mb,
                                  const Saved& s, bool want_dx) {
  auto& p = params();
  // MLP branch; the residual passes dy straight to x2.
  Tensor dg = b.LinearBackward(s[kG], p[kFc2W].value, dy, true, p[kFc2W].grad, &p[kFc2B].grad);
  Tensor df = b.GeluBackward(s[kF], dg);
  Tensor dh2 = b.LinearBackward(s[kH2], p[kFcW].value, df, true, p[kFcW].grad, &p[kFcB].grad);
  Tensor dx2 = b.Add(dy, b.LayerNormBackward(s[kX2], p[kLn2W].value, s[kMean2], s[kRstd2], dh2,
                                             p[kLn2W].grad, p[kLn2B].grad));
  // Attention branch; the residual passes dx2 straight to x.
  Tensor datt =
      b.LinearBackward(s[kAtt], p[kProjW].value, dx2, true, p[kProjW].grad, &p[kProjB].grad);
  Tensor dqkv = b.AttentionBackward(s[kQkv], s[kAtt], s[kLse], datt, mb.batch, heads_);
  Tensor dh1 = b.LinearBackward(s[kH1], p[kQkvW].value, dqkv, true, p[kQkvW].grad, &p[kQkvB].grad);
  Tensor dln1 = b.LayerNormBackward(s[kX], p[kLn1W].value, s[kMean1], s[kRstd1], dh1, p[kLn1W].grad,
                                    p[kLn1B].grad);
  return want_dx ? b.Add(dx2, dln1) : Tensor();
}

}  // namespace zo::model
