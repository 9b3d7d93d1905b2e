// The CUDA backend's ops that are the project's own kernels
// (internal/kernels.h): each checks its shapes, allocates its outputs and
// queues the launch on the backend's stream.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/backend/cuda/internal/cuda_backend_impl.h"

namespace zo::backend::cuda {
namespace {

std::string Describe2(const Tensor& a, const Tensor& b) {
  return absl::StrCat(Describe("a", a), ", ", Describe("b", b));
}

}  // namespace

// ---------------------------------------------------------------- embedding

Tensor CudaBackend::Embedding(absl::Span<const int32_t> tokens, int block_size, const Tensor& wte,
                              const Tensor& wpe) {
  const int64_t rows = static_cast<int64_t>(tokens.size());
  CheckShape(wte.rank() == 2 && wpe.rank() == 2 && wpe.dim(1) == wte.dim(1) && block_size > 0 &&
                 wpe.dim(0) >= block_size,
             "Embedding", [&] {
               return absl::StrCat(Describe("wte", wte), ", ", Describe("wpe", wpe),
                                   ", block_size ", block_size);
             });
  for (int32_t tok : tokens) {
    CheckShape(tok >= 0 && tok < wte.dim(0), "Embedding", [&] {
      return absl::StrCat("token ", tok, " outside the vocabulary [0, ", wte.dim(0), ")");
    });
  }
  const int64_t cols = wte.dim(1);
  Tensor y = Empty(wte.dtype(), {rows, cols});
  if (rows == 0) return y;
  const Tensor dev_tokens = UploadIndices(tokens, "Embedding");
  ZO_CUDA_OP(LaunchEmbedding(static_cast<const int32_t*>(dev_tokens.storage()), rows, block_size,
                             In(wte), In(wpe), cols, Out(y), context_->stream),
             "LaunchEmbedding", "Embedding",
             [&] { return absl::StrCat(Describe("wte", wte), ", rows ", rows); });
  return y;
}

void CudaBackend::EmbeddingBackward(absl::Span<const int32_t> tokens, int block_size,
                                    const Tensor& dy, Tensor& dwte, Tensor& dwpe) {
  const int64_t rows = static_cast<int64_t>(tokens.size());
  CheckShape(dy.rank() == 2 && dy.dim(0) == rows && dwte.rank() == 2 && dwpe.rank() == 2 &&
                 dwte.dim(1) == dy.dim(1) && dwpe.dim(1) == dy.dim(1) && block_size > 0 &&
                 dwpe.dim(0) >= block_size,
             "EmbeddingBackward", [&] {
               return absl::StrCat(Describe("dy", dy), ", ", Describe("dwte", dwte), ", ",
                                   Describe("dwpe", dwpe), ", tokens ", rows);
             });
  if (rows == 0) return;
  // Group the rows by token on the host (it has the tokens), so each token's
  // gradient row is summed by one block in row order: deterministic. A
  // counting sort over the vocabulary: stable, O(rows + vocabulary).
  const int64_t vocab = dwte.dim(0);
  std::vector<int32_t> count(static_cast<size_t>(vocab) + 1, 0);
  for (int64_t r = 0; r < rows; ++r) {
    CheckShape(tokens[r] >= 0 && tokens[r] < vocab, "EmbeddingBackward", [&] {
      return absl::StrCat("token ", tokens[r], " outside the vocabulary [0, ", vocab, ")");
    });
    ++count[tokens[r] + 1];
  }
  std::vector<int32_t> unique, offset;
  for (int64_t tok = 0; tok < vocab; ++tok) {
    if (count[tok + 1] > 0) {
      unique.push_back(static_cast<int32_t>(tok));
      offset.push_back(count[tok]);
    }
    count[tok + 1] += count[tok];  // now: where token tok + 1's rows start
  }
  offset.push_back(static_cast<int32_t>(rows));
  std::vector<int32_t> index(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) index[count[tokens[r]]++] = static_cast<int32_t>(r);
  const Tensor d_unique = UploadIndices(unique, "EmbeddingBackward");
  const Tensor d_offset = UploadIndices(offset, "EmbeddingBackward");
  const Tensor d_index = UploadIndices(index, "EmbeddingBackward");
  ZO_CUDA_OP(LaunchEmbeddingBackward(static_cast<const int32_t*>(d_unique.storage()),
                                     static_cast<const int32_t*>(d_offset.storage()),
                                     static_cast<const int32_t*>(d_index.storage()),
                                     static_cast<int64_t>(unique.size()), rows, block_size, In(dy),
                                     dy.dim(1), Out(dwte), Out(dwpe), context_->stream),
             "LaunchEmbeddingBackward", "EmbeddingBackward",
             [&] { return absl::StrCat(Describe("dy", dy), ", ", Describe("dwte", dwte)); });
}

// ---------------------------------------------------------------- layer norm

Tensor CudaBackend::LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                              Tensor& mean, Tensor& rstd) {
  const auto describe = [&] {
    return absl::StrCat(Describe("x", x), ", ", Describe("gamma", gamma), ", ",
                        Describe("beta", beta), ", ", Describe("mean", mean), ", ",
                        Describe("rstd", rstd));
  };
  CheckShape(x.rank() == 2 && gamma.shape() == Shape{x.dim(1)} && beta.shape() == gamma.shape() &&
                 mean.shape() == Shape{x.dim(0)} && rstd.shape() == mean.shape() &&
                 mean.dtype() == DType::kFloat32 && rstd.dtype() == DType::kFloat32,
             "LayerNorm", describe);
  Tensor y = Empty(x.dtype(), x.shape());
  ZO_CUDA_OP(LaunchLayerNorm(In(x), In(gamma), In(beta), eps, x.dim(0), x.dim(1), Out(y),
                             static_cast<float*>(mean.storage()),
                             static_cast<float*>(rstd.storage()), context_->stream),
             "LaunchLayerNorm", "LayerNorm", describe);
  return y;
}

Tensor CudaBackend::LayerNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                      const Tensor& rstd, const Tensor& dy, Tensor& dgamma,
                                      Tensor& dbeta) {
  const auto describe = [&] {
    return absl::StrCat(Describe("x", x), ", ", Describe("gamma", gamma), ", ",
                        Describe("mean", mean), ", ", Describe("rstd", rstd), ", ",
                        Describe("dy", dy), ", ", Describe("dgamma", dgamma), ", ",
                        Describe("dbeta", dbeta));
  };
  CheckShape(x.rank() == 2 && gamma.shape() == Shape{x.dim(1)} && mean.shape() == Shape{x.dim(0)} &&
                 rstd.shape() == mean.shape() && mean.dtype() == DType::kFloat32 &&
                 rstd.dtype() == DType::kFloat32 && dy.shape() == x.shape() &&
                 dgamma.shape() == gamma.shape() && dbeta.shape() == gamma.shape(),
             "LayerNormBackward", describe);
  Tensor dx = Empty(x.dtype(), x.shape());
  Tensor scratch = Empty(DType::kFloat32, {LayerNormBackwardScratchFloats(x.dim(0), x.dim(1))});
  ZO_CUDA_OP(LaunchLayerNormBackward(In(x), In(gamma), static_cast<const float*>(mean.storage()),
                                     static_cast<const float*>(rstd.storage()), In(dy), x.dim(0),
                                     x.dim(1), Out(dx), Out(dgamma), Out(dbeta),
                                     static_cast<float*>(scratch.storage()), context_->stream),
             "LaunchLayerNormBackward", "LayerNormBackward", describe);
  return dx;
}

// ---------------------------------------------------------------- pointwise

Tensor CudaBackend::Gelu(const Tensor& x) {
  Tensor y = Empty(x.dtype(), x.shape());
  ZO_CUDA_OP(LaunchGelu(In(x), Out(y), x.numel(), context_->stream), "LaunchGelu", "Gelu",
             [&] { return Describe("x", x); });
  return y;
}

Tensor CudaBackend::GeluBackward(const Tensor& x, const Tensor& dy) {
  CheckShape(x.shape() == dy.shape(), "GeluBackward", [&] { return Describe2(x, dy); });
  Tensor dx = Empty(x.dtype(), x.shape());
  ZO_CUDA_OP(LaunchGeluBackward(In(x), In(dy), Out(dx), x.numel(), context_->stream),
             "LaunchGeluBackward", "GeluBackward", [&] { return Describe2(x, dy); });
  return dx;
}

Tensor CudaBackend::Relu(const Tensor& x) {
  Tensor y = Empty(x.dtype(), x.shape());
  ZO_CUDA_OP(LaunchRelu(In(x), Out(y), x.numel(), context_->stream), "LaunchRelu", "Relu",
             [&] { return Describe("x", x); });
  return y;
}

Tensor CudaBackend::ReluBackward(const Tensor& x, const Tensor& dy) {
  CheckShape(x.shape() == dy.shape(), "ReluBackward", [&] { return Describe2(x, dy); });
  Tensor dx = Empty(x.dtype(), x.shape());
  ZO_CUDA_OP(LaunchReluBackward(In(x), In(dy), Out(dx), x.numel(), context_->stream),
             "LaunchReluBackward", "ReluBackward", [&] { return Describe2(x, dy); });
  return dx;
}

Tensor CudaBackend::Add(const Tensor& a, const Tensor& b) {
  CheckShape(a.shape() == b.shape(), "Add", [&] { return Describe2(a, b); });
  Tensor y = Empty(a.dtype(), a.shape());
  ZO_CUDA_OP(LaunchAdd(In(a), In(b), Out(y), a.numel(), context_->stream), "LaunchAdd", "Add",
             [&] { return Describe2(a, b); });
  return y;
}

void CudaBackend::AddInto(const Tensor& x, Tensor& y) {
  CheckShape(x.shape() == y.shape(), "AddInto", [&] { return Describe2(x, y); });
  ZO_CUDA_OP(LaunchAddInto(In(x), Out(y), x.numel(), context_->stream), "LaunchAddInto", "AddInto",
             [&] { return Describe2(x, y); });
}

void CudaBackend::CombineWeights(const Tensor& last, const Tensor& before, const Tensor& grad,
                                 float a, float b, float c, Tensor& out) {
  const auto describe = [&] {
    return absl::StrCat(Describe2(last, out), before.defined() ? ", " : "",
                        before.defined() ? Describe("before", before) : "",
                        grad.defined() ? ", " : "", grad.defined() ? Describe("grad", grad) : "");
  };
  CheckShape(last.shape() == out.shape() && (!before.defined() || before.shape() == last.shape()) &&
                 (!grad.defined() || grad.shape() == last.shape()),
             "CombineWeights", describe);
  const ConstView none{nullptr, last.dtype()};
  ZO_CUDA_OP(LaunchCombineWeights(In(last), before.defined() ? In(before) : none,
                                  grad.defined() ? In(grad) : none, Out(out), last.numel(), a, b, c,
                                  context_->stream),
             "LaunchCombineWeights", "CombineWeights", describe);
}

// ---------------------------------------------------------------- attention

namespace {

struct AttentionDims {
  int t, c;
};

template <typename Describe>
AttentionDims CheckAttention(const char* op, const Tensor& qkv, int batch, int heads,
                             Describe&& describe) {
  CheckShape(qkv.rank() == 2 && batch > 0 && heads > 0 && qkv.dim(0) % batch == 0 &&
                 qkv.dim(1) % (3 * heads) == 0,
             op, describe);
  return {static_cast<int>(qkv.dim(0) / batch), static_cast<int>(qkv.dim(1) / 3)};
}

}  // namespace

Tensor CudaBackend::Attention(const Tensor& qkv, int batch, int heads, Tensor& lse) {
  const auto describe = [&] {
    return absl::StrCat(Describe("qkv", qkv), ", batch ", batch, ", heads ", heads, ", ",
                        Describe("lse", lse));
  };
  const AttentionDims dims = CheckAttention("Attention", qkv, batch, heads, describe);
  CheckShape(lse.shape() == Shape{batch, heads, dims.t} && lse.dtype() == DType::kFloat32,
             "Attention", describe);
  Tensor y = Empty(qkv.dtype(), {qkv.dim(0), dims.c});
  ZO_CUDA_OP(LaunchAttention(In(qkv), batch, dims.t, heads, dims.c, Out(y),
                             static_cast<float*>(lse.storage()), context_->stream),
             "LaunchAttention", "Attention", describe);
  return y;
}

Tensor CudaBackend::AttentionBackward(const Tensor& qkv, const Tensor& y, const Tensor& lse,
                                      const Tensor& dy, int batch, int heads) {
  const auto describe = [&] {
    return absl::StrCat(Describe("qkv", qkv), ", ", Describe("y", y), ", ", Describe("lse", lse),
                        ", ", Describe("dy", dy), ", batch ", batch, ", heads ", heads);
  };
  const AttentionDims dims = CheckAttention("AttentionBackward", qkv, batch, heads, describe);
  CheckShape(lse.shape() == Shape{batch, heads, dims.t} && lse.dtype() == DType::kFloat32 &&
                 dy.shape() == Shape{qkv.dim(0), dims.c} && y.shape() == dy.shape(),
             "AttentionBackward", describe);
  Tensor dqkv = Empty(qkv.dtype(), qkv.shape());
  Tensor scratch =
      Empty(DType::kFloat32, {AttentionBackwardScratchFloats(batch, dims.t, heads, dims.c)});
  ZO_CUDA_OP(LaunchAttentionBackward(In(qkv), In(y), static_cast<const float*>(lse.storage()),
                                     In(dy), batch, dims.t, heads, dims.c, Out(dqkv),
                                     static_cast<float*>(scratch.storage()), context_->stream),
             "LaunchAttentionBackward", "AttentionBackward", describe);
  return dqkv;
}

// ---------------------------------------------------------------- loss

Tensor CudaBackend::CrossEntropy(const Tensor& logits, absl::Span<const int32_t> targets) {
  const int64_t rows = static_cast<int64_t>(targets.size());
  CheckShape(logits.rank() == 2 && logits.dim(0) == rows, "CrossEntropy",
             [&] { return absl::StrCat(Describe("logits", logits), ", targets ", rows); });
  for (int32_t t : targets) {
    CheckShape(t >= 0 && t < logits.dim(1), "CrossEntropy",
               [&] { return absl::StrCat("target ", t, " outside [0, ", logits.dim(1), ")"); });
  }
  if (rows == 0) return Zeros(DType::kFloat32, {1});  // as the CPU backend: no rows, no loss
  Tensor loss = Empty(DType::kFloat32, {1});
  Tensor scratch = Empty(DType::kFloat32, {rows});
  const Tensor dev_targets = UploadIndices(targets, "CrossEntropy");
  ZO_CUDA_OP(LaunchCrossEntropy(In(logits), static_cast<const int32_t*>(dev_targets.storage()),
                                rows, logits.dim(1), static_cast<float*>(loss.storage()),
                                static_cast<float*>(scratch.storage()), context_->stream),
             "LaunchCrossEntropy", "CrossEntropy", [&] { return Describe("logits", logits); });
  return loss;
}

Tensor CudaBackend::CrossEntropyBackward(const Tensor& logits, absl::Span<const int32_t> targets,
                                         float scale) {
  const int64_t rows = static_cast<int64_t>(targets.size());
  CheckShape(logits.rank() == 2 && logits.dim(0) == rows, "CrossEntropyBackward",
             [&] { return absl::StrCat(Describe("logits", logits), ", targets ", rows); });
  for (int32_t t : targets) {
    CheckShape(t >= 0 && t < logits.dim(1), "CrossEntropyBackward",
               [&] { return absl::StrCat("target ", t, " outside [0, ", logits.dim(1), ")"); });
  }
  Tensor dlogits = Empty(logits.dtype(), logits.shape());
  const Tensor dev_targets = UploadIndices(targets, "CrossEntropyBackward");
  ZO_CUDA_OP(
      LaunchCrossEntropyBackward(In(logits), static_cast<const int32_t*>(dev_targets.storage()),
                                 rows, logits.dim(1), scale, Out(dlogits), context_->stream),
      "LaunchCrossEntropyBackward", "CrossEntropyBackward",
      [&] { return Describe("logits", logits); });
  return dlogits;
}

}  // namespace zo::backend::cuda
