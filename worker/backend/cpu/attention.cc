// Causal multi-head self-attention: per sequence and head, the products are
// OpenBLAS sgemm calls on strided views of qkv (leading dimension 3C); the
// softmax and its backward are row loops. Like the CUDA backend's fused
// kernels it keeps only each row's log-sum-exp between forward and
// backward, and the backward recomputes the probabilities from it.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/backend/cpu/internal/cpu_backend_impl.h"
#include "worker/backend/cpu/internal/pointwise_kernels.h"

namespace zo::backend::cpu {
namespace {

// The sizes of one Attention call, validated.
struct Dims {
  int t;  // sequence length
  int c;  // model width
  int d;  // head width, c / heads
};

// `more` describes the call's other tensors, for the message.
template <typename Describe>
Dims CheckDims(const char* op, const Tensor& qkv, int batch, int heads, Describe&& more) {
  const bool ok = qkv.rank() == 2 && batch > 0 && heads > 0 && qkv.dim(0) % batch == 0 &&
                  qkv.dim(1) % (3 * heads) == 0;
  CheckShape(ok, op, [&] {
    return absl::StrCat("qkv ", ShapeString(qkv.shape()), ", batch ", batch, ", heads ", heads,
                        more());
  });
  const int t = static_cast<int>(qkv.dim(0) / batch);
  const int c = static_cast<int>(qkv.dim(1) / 3);
  return Dims{t, c, c / heads};
}

}  // namespace

namespace {

// Row i of S = q · k^T / sqrt(d) for keys 0..i, turned into the softmax in
// place; returns the row's log-sum-exp (what the backward recomputes P from).
float SoftmaxRow(float* row, int i) {
  float max = row[0];
  for (int j = 1; j <= i; ++j) max = std::max(max, row[j]);
  cpu_internal::ExpShifted(row, max, row, i + 1);
  float sum = 0.0f;
  for (int j = 0; j <= i; ++j) sum += row[j];
  const float inv = 1.0f / sum;
  for (int j = 0; j <= i; ++j) row[j] *= inv;
  return max + std::log(sum);
}

}  // namespace

Tensor CpuBackend::Attention(const Tensor& qkv, int batch, int heads, Tensor& lse) {
  const auto lse_desc = [&] {
    return absl::StrCat(", lse ", ShapeString(lse.shape()), " ",
                        std::string(DTypeName(lse.dtype())));
  };
  const Dims dims = CheckDims("Attention", qkv, batch, heads, lse_desc);
  const int t = dims.t, c = dims.c, d = dims.d;
  CheckShape(
      lse.shape() == Shape{batch, heads, t} && lse.dtype() == DType::kFloat32, "Attention", [&] {
        return absl::StrCat("qkv ", ShapeString(qkv.shape()), ", batch ", batch, ", heads ", heads,
                            lse_desc(), " (want lse [", batch, ", ", heads, ", ", t, "] fp32)");
      });
  Tensor y = Empty(qkv.dtype(), {qkv.dim(0), c});
  if (y.numel() == 0) return y;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int ld = 3 * c;
  // P stays fp32, as in a fused kernel's registers; only y is rounded.
  std::vector<float> p(static_cast<size_t>(t) * t);
  for (int b = 0; b < batch; ++b) {
    const float* seq = Data(qkv) + static_cast<int64_t>(b) * t * ld;
    for (int h = 0; h < heads; ++h) {
      const float* q = seq + h * d;
      const float* k = q + c;
      const float* v = q + 2 * c;
      float* row_lse = Data(lse) + (static_cast<int64_t>(b) * heads + h) * t;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, d, scale, q, ld, k, ld, 0.0f,
                  p.data(), t);
      for (int i = 0; i < t; ++i) {
        float* row = p.data() + static_cast<int64_t>(i) * t;
        row_lse[i] = SoftmaxRow(row, i);
        std::fill(row + i + 1, row + t, 0.0f);
      }
      // y[t, d] = P · v, into columns [h d, (h + 1) d) of y.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, d, t, 1.0f, p.data(), t, v, ld,
                  0.0f, Data(y) + static_cast<int64_t>(b) * t * c + h * d, c);
    }
  }
  RoundTo(y.dtype(), Data(y), y.numel());
  return y;
}

Tensor CpuBackend::AttentionBackward(const Tensor& qkv, const Tensor& y, const Tensor& lse,
                                     const Tensor& dy, int batch, int heads) {
  const auto more = [&] {
    return absl::StrCat(", y ", ShapeString(y.shape()), ", lse ", ShapeString(lse.shape()), ", dy ",
                        ShapeString(dy.shape()));
  };
  const Dims dims = CheckDims("AttentionBackward", qkv, batch, heads, more);
  const int t = dims.t, c = dims.c, d = dims.d;
  CheckShape(lse.shape() == Shape{batch, heads, t} && lse.dtype() == DType::kFloat32 &&
                 dy.shape() == Shape{qkv.dim(0), c} && y.shape() == dy.shape(),
             "AttentionBackward", [&] {
               return absl::StrCat("qkv ", ShapeString(qkv.shape()), ", batch ", batch, ", heads ",
                                   heads, more());
             });
  Tensor dqkv = Empty(qkv.dtype(), qkv.shape());
  if (dqkv.numel() == 0) return dqkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int ld = 3 * c;
  std::vector<float> p(static_cast<size_t>(t) * t);   // P, recomputed from lse
  std::vector<float> ds(static_cast<size_t>(t) * t);  // dP, then dS in place
  for (int b = 0; b < batch; ++b) {
    const float* seq = Data(qkv) + static_cast<int64_t>(b) * t * ld;
    float* dseq = Data(dqkv) + static_cast<int64_t>(b) * t * ld;
    const float* dyseq = Data(dy) + static_cast<int64_t>(b) * t * c;
    for (int h = 0; h < heads; ++h) {
      const float* q = seq + h * d;
      const float* k = q + c;
      const float* v = q + 2 * c;
      float* dq = dseq + h * d;
      float* dk = dq + c;
      float* dv = dq + 2 * c;
      const float* g = dyseq + h * d;
      const float* row_lse = Data(lse) + (static_cast<int64_t>(b) * heads + h) * t;
      // P = exp(q · k^T / sqrt(d) − lse), zero past the diagonal.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, d, scale, q, ld, k, ld, 0.0f,
                  p.data(), t);
      for (int i = 0; i < t; ++i) {
        float* row = p.data() + static_cast<int64_t>(i) * t;
        cpu_internal::ExpShifted(row, row_lse[i], row, i + 1);
        std::fill(row + i + 1, row + t, 0.0f);
      }
      // dP[t, t] = dy · v^T; dv[t, d] = P^T · dy.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, d, 1.0f, g, c, v, ld, 0.0f,
                  ds.data(), t);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t, d, t, 1.0f, p.data(), t, g, c, 0.0f,
                  dv, ld);
      // dS = P ∘ (dP − rowsum(dP ∘ P)); masked entries have P = 0. (The
      // row sum equals rowsum(dy ∘ y), which a fused kernel uses instead.)
      for (int i = 0; i < t; ++i) {
        const float* prow = p.data() + static_cast<int64_t>(i) * t;
        float* srow = ds.data() + static_cast<int64_t>(i) * t;
        float dot = 0.0f;
        for (int j = 0; j < t; ++j) dot += srow[j] * prow[j];
        for (int j = 0; j < t; ++j) srow[j] = prow[j] * (srow[j] - dot);
      }
      // dq = dS · k / sqrt(d); dk = dS^T · q / sqrt(d).
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, d, t, scale, ds.data(), t, k, ld,
                  0.0f, dq, ld);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t, d, t, scale, ds.data(), t, q, ld,
                  0.0f, dk, ld);
    }
  }
  RoundTo(dqkv.dtype(), Data(dqkv), dqkv.numel());
  return dqkv;
}

}  // namespace zo::backend::cpu
