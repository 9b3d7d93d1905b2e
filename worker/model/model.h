// The two models the worker trains, as ordered lists of layers (what
// partitioning cuts into stages), and the task each one learns.
//
// GPT-lite (character level, Karpathy's nanoGPT shape as DeepSpeed's GPT-lite
// study uses it): embedding, n_layer transformer blocks, final LayerNorm,
// linear head to the vocabulary; next-character cross-entropy.
// The benchmark MLP: an input layer, depth x (Linear W->W, ReLU), a linear
// head to C classes; x uniform in [0, 1)^W, label floor(x.x) mod C.
#ifndef ZO_WORKER_MODEL_MODEL_H_
#define ZO_WORKER_MODEL_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/sharding.h"
#include "worker/model/layer.h"

namespace zo::model {

struct GptConfig {
  int n_layer = 4;
  int n_embd = 128;
  int n_head = 4;
  int block_size = 64;
  int vocab = 65;
};

struct MlpConfig {
  int width = 256;
  int depth = 4;
  int classes = 16;
};

struct Model {
  enum class Kind { kGpt, kMlp };
  Kind kind = Kind::kGpt;
  GptConfig gpt;
  MlpConfig mlp;
  std::vector<std::unique_ptr<Layer>> layers;

  int64_t param_count() const;
  // Every parameter, in layer order, in `dtype`: the job's manifest.
  std::vector<TensorSpec> Manifest(DType dtype) const;
  // "GPT-lite: 4 layers, 128 dim, 4 heads, block 64, vocab 65 (0.80 M parameters)".
  std::string Describe() const;
};

// INVALID_ARGUMENT naming the field for a non-positive size or n_embd not a
// multiple of n_head.
absl::StatusOr<Model> MakeGpt(const GptConfig& config);
// `dtype` is the activation dtype the input layer uploads features in.
absl::StatusOr<Model> MakeMlp(const MlpConfig& config, DType dtype);

// Micro-batch `micro_batch` of `step` of the MLP task for dp rank `dp_rank`:
// `batch` samples, a pure function of (seed, step, micro_batch, dp_rank).
MicroBatch MlpMicroBatch(const MlpConfig& config, uint64_t seed, int64_t step, int micro_batch,
                         int dp_rank, int batch);

}  // namespace zo::model

#endif  // ZO_WORKER_MODEL_MODEL_H_
