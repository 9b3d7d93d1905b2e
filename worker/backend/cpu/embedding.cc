// Token plus position embedding and its backward (scatter-add).
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/backend/cpu/internal/cpu_backend_impl.h"

namespace zo::backend::cpu {
namespace {

std::string EmbeddingShapes(size_t rows, int block_size, const Tensor& t, const Tensor& p,
                            const char* t_name, const char* p_name) {
  return absl::StrCat(rows, " tokens, block_size ", block_size, ", ", t_name, " ",
                      ShapeString(t.shape()), ", ", p_name, " ", ShapeString(p.shape()));
}

}  // namespace

Tensor CpuBackend::Embedding(absl::Span<const int32_t> tokens, int block_size, const Tensor& wte,
                             const Tensor& wpe) {
  CheckShape(block_size > 0 && wte.rank() == 2 && wpe.rank() == 2 && wte.dim(1) == wpe.dim(1) &&
                 wpe.dim(0) >= block_size,
             "Embedding",
             [&] { return EmbeddingShapes(tokens.size(), block_size, wte, wpe, "wte", "wpe"); });
  const int64_t rows = static_cast<int64_t>(tokens.size());
  const int64_t vocab = wte.dim(0), c = wte.dim(1);
  Tensor y = Empty(wte.dtype(), {rows, c});
  float* py = Data(y);
  const float* pte = Data(wte);
  const float* ppe = Data(wpe);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t token = tokens[r];
    CheckShape(token >= 0 && token < vocab, "Embedding", [&] {
      return absl::StrCat("token ", token, " at row ", r, " outside [0, ", vocab, ") of wte ",
                          ShapeString(wte.shape()));
    });
    const float* te = pte + token * c;
    const float* pe = ppe + (r % block_size) * c;
    float* out = py + r * c;
    for (int64_t i = 0; i < c; ++i) out[i] = te[i] + pe[i];
  }
  RoundTo(y.dtype(), py, y.numel());
  return y;
}

void CpuBackend::EmbeddingBackward(absl::Span<const int32_t> tokens, int block_size,
                                   const Tensor& dy, Tensor& dwte, Tensor& dwpe) {
  const int64_t rows = static_cast<int64_t>(tokens.size());
  CheckShape(block_size > 0 && dwte.rank() == 2 && dwpe.rank() == 2 && dwte.dim(1) == dwpe.dim(1) &&
                 dwpe.dim(0) >= block_size && dy.rank() == 2 && dy.dim(0) == rows &&
                 dy.dim(1) == dwte.dim(1),
             "EmbeddingBackward", [&] {
               return absl::StrCat(
                   EmbeddingShapes(tokens.size(), block_size, dwte, dwpe, "dwte", "dwpe"), ", dy ",
                   ShapeString(dy.shape()));
             });
  const int64_t vocab = dwte.dim(0), c = dwte.dim(1);
  const float* pdy = Data(dy);
  float* pte = Data(dwte);
  float* ppe = Data(dwpe);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t token = tokens[r];
    CheckShape(token >= 0 && token < vocab, "EmbeddingBackward", [&] {
      return absl::StrCat("token ", token, " at row ", r, " outside [0, ", vocab, ") of dwte ",
                          ShapeString(dwte.shape()));
    });
    const float* g = pdy + r * c;
    float* te = pte + token * c;
    float* pe = ppe + (r % block_size) * c;
    for (int64_t i = 0; i < c; ++i) {
      te[i] += g[i];
      pe[i] += g[i];
    }
  }
  // Idempotent on untouched rows (already representable); free for fp32.
  RoundTo(dwte.dtype(), pte, dwte.numel());
  RoundTo(dwpe.dtype(), ppe, dwpe.numel());
}

}  // namespace zo::backend::cpu
