// One GPT-2 style pre-norm transformer block, the unit GPT-lite's
// partitioning and checkpointing count:
//   x2 = x  + proj(attention(qkv(ln1(x))))
//   y  = x2 + fc2(gelu(fc1(ln2(x2))))
// Causal multi-head attention, MLP width 4 * dim. Weights N(0, 0.02); the two
// projections into the residual N(0, 0.02 / sqrt(2 * n_layer)) as GPT-2.
#ifndef ZO_WORKER_MODEL_TRANSFORMER_BLOCK_H_
#define ZO_WORKER_MODEL_TRANSFORMER_BLOCK_H_

#include <string>

#include "worker/model/layer.h"

namespace zo::model {

class TransformerBlock final : public Layer {
 public:
  TransformerBlock(std::string name, int dim, int heads, int n_layer);

  backend::Tensor Forward(backend::Backend& b, const backend::Tensor& x, const MicroBatch& mb,
                          Saved& saved) override;
  backend::Tensor Backward(backend::Backend& b, const backend::Tensor& dy, const MicroBatch& mb,
                           const Saved& saved, bool want_dx) override;

 private:
  int heads_;
};

}  // namespace zo::model

#endif  // ZO_WORKER_MODEL_TRANSFORMER_BLOCK_H_
