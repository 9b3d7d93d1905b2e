#include "worker/model/model.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/counter_rng.h"
#include "worker/model/basic_layers.h"
#include "worker/model/transformer_block.h"

namespace zo::model {
namespace {

absl::Status RequirePositive(const char* model, const char* field, int value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(model, ": ", field, " must be positive, got ", value));
}

}  // namespace

int64_t Model::param_count() const {
  int64_t n = 0;
  for (const auto& layer : layers) n += layer->param_count();
  return n;
}

std::vector<TensorSpec> Model::Manifest(DType dtype) const {
  std::vector<TensorSpec> manifest;
  for (const auto& layer : layers) {
    for (const Param& p : layer->params()) manifest.push_back({p.name, p.shape, dtype});
  }
  return manifest;
}

std::string Model::Describe() const {
  const double millions = static_cast<double>(param_count()) / 1e6;
  if (kind == Kind::kGpt) {
    return absl::StrFormat(
        "GPT-lite: %d layers, %d dim, %d heads, block %d, vocab %d (%.2f M parameters)",
        gpt.n_layer, gpt.n_embd, gpt.n_head, gpt.block_size, gpt.vocab, millions);
  }
  return absl::StrFormat("MLP: width %d, depth %d, %d classes (%.2f M parameters)", mlp.width,
                         mlp.depth, mlp.classes, millions);
}

absl::StatusOr<Model> MakeGpt(const GptConfig& c) {
  for (auto [field, value] : {std::pair{"n_layer", c.n_layer},
                              {"n_embd", c.n_embd},
                              {"n_head", c.n_head},
                              {"block_size", c.block_size},
                              {"vocab", c.vocab}}) {
    if (absl::Status s = RequirePositive("GPT-lite", field, value); !s.ok()) return s;
  }
  if (c.n_embd % c.n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPT-lite: n_embd (", c.n_embd, ") must be a multiple of n_head (", c.n_head, ")"));
  }
  Model m;
  m.kind = Model::Kind::kGpt;
  m.gpt = c;
  m.layers.push_back(std::make_unique<EmbeddingLayer>("embed", c.vocab, c.block_size, c.n_embd));
  for (int i = 0; i < c.n_layer; ++i) {
    m.layers.push_back(
        std::make_unique<TransformerBlock>(absl::StrCat("h.", i), c.n_embd, c.n_head, c.n_layer));
  }
  m.layers.push_back(std::make_unique<LayerNormLayer>("ln_f", c.n_embd));
  m.layers.push_back(std::make_unique<LinearLayer>(
      "lm_head", c.n_embd, c.vocab, ParamInit::Normal(0.02), ParamInit::Constant(0)));
  return m;
}

absl::StatusOr<Model> MakeMlp(const MlpConfig& c, DType dtype) {
  for (auto [field, value] :
       {std::pair{"width", c.width}, {"depth", c.depth}, {"classes", c.classes}}) {
    if (absl::Status s = RequirePositive("MLP", field, value); !s.ok()) return s;
  }
  Model m;
  m.kind = Model::Kind::kMlp;
  m.mlp = c;
  m.layers.push_back(std::make_unique<FeatureInputLayer>("input", c.width, dtype));
  for (int i = 0; i < c.depth; ++i) {
    m.layers.push_back(std::make_unique<LinearLayer>(absl::StrCat("fc.", i), c.width, c.width));
    m.layers.push_back(std::make_unique<ReluLayer>(absl::StrCat("relu.", i)));
  }
  m.layers.push_back(std::make_unique<LinearLayer>("head", c.width, c.classes));
  return m;
}

MicroBatch MlpMicroBatch(const MlpConfig& c, uint64_t seed, int64_t step, int micro_batch,
                         int dp_rank, int batch) {
  MicroBatch mb;
  mb.batch = batch;
  mb.block_size = 1;
  mb.features.resize(static_cast<size_t>(batch) * c.width);
  mb.targets.resize(static_cast<size_t>(batch));
  // One key per (step, micro-batch, rank, sample), so any rank or restarted
  // run draws the same samples.
  const uint64_t stream =
      CounterRandom(seed, static_cast<uint64_t>(step), static_cast<uint64_t>(micro_batch),
                    static_cast<uint64_t>(dp_rank));
  for (int r = 0; r < batch; ++r) {
    double dot = 0;
    for (int j = 0; j < c.width; ++j) {
      const uint64_t bits =
          CounterRandom(stream, static_cast<uint64_t>(r), static_cast<uint64_t>(j));
      const float x = static_cast<float>(static_cast<double>(bits >> 40) * 0x1.0p-24);
      mb.features[static_cast<size_t>(r) * c.width + j] = x;
      dot += double{x} * x;
    }
    mb.targets[static_cast<size_t>(r)] =
        static_cast<int32_t>(static_cast<int64_t>(std::floor(dot)) % c.classes);
  }
  return mb;
}

}  // namespace zo::model
