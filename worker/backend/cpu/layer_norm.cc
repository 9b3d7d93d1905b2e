// LayerNorm over the last dimension (torch.nn.LayerNorm) and its backward.
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/backend/cpu/internal/cpu_backend_impl.h"

namespace zo::backend::cpu {

Tensor CpuBackend::LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                             Tensor& mean, Tensor& rstd) {
  CheckShape(x.rank() == 2 && gamma.shape() == Shape{x.dim(1)} && beta.shape() == gamma.shape() &&
                 mean.shape() == Shape{x.dim(0)} && rstd.shape() == mean.shape() &&
                 mean.dtype() == DType::kFloat32 && rstd.dtype() == DType::kFloat32,
             "LayerNorm", [&] {
               return absl::StrCat(
                   "x ", ShapeString(x.shape()), ", gamma ", ShapeString(gamma.shape()), ", beta ",
                   ShapeString(beta.shape()), ", mean ", ShapeString(mean.shape()), " ",
                   std::string(DTypeName(mean.dtype())), ", rstd ", ShapeString(rstd.shape()), " ",
                   std::string(DTypeName(rstd.dtype())));
             });
  const int64_t rows = x.dim(0), c = x.dim(1);
  Tensor y = Empty(x.dtype(), x.shape());
  const float* px = Data(x);
  const float* pg = Data(gamma);
  const float* pb = Data(beta);
  float* py = Data(y);
  float* pmean = Data(mean);
  float* prstd = Data(rstd);
  const float inv_c = c > 0 ? 1.0f / static_cast<float>(c) : 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = px + r * c;
    float sum = 0.0f;
    for (int64_t i = 0; i < c; ++i) sum += row[i];
    const float m = sum * inv_c;
    float sq = 0.0f;  // two passes: no cancellation for large means
    for (int64_t i = 0; i < c; ++i) {
      const float d = row[i] - m;
      sq += d * d;
    }
    const float s = 1.0f / std::sqrt(sq * inv_c + eps);
    float* out = py + r * c;
    for (int64_t i = 0; i < c; ++i) out[i] = (row[i] - m) * s * pg[i] + pb[i];
    pmean[r] = m;
    prstd[r] = s;
  }
  RoundTo(y.dtype(), py, y.numel());
  return y;
}

Tensor CpuBackend::LayerNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                     const Tensor& rstd, const Tensor& dy, Tensor& dgamma,
                                     Tensor& dbeta) {
  CheckShape(x.rank() == 2 && gamma.shape() == Shape{x.dim(1)} && mean.shape() == Shape{x.dim(0)} &&
                 rstd.shape() == mean.shape() && mean.dtype() == DType::kFloat32 &&
                 rstd.dtype() == DType::kFloat32 && dy.shape() == x.shape() &&
                 dgamma.shape() == gamma.shape() && dbeta.shape() == gamma.shape(),
             "LayerNormBackward", [&] {
               return absl::StrCat(
                   "x ", ShapeString(x.shape()), ", gamma ", ShapeString(gamma.shape()), ", mean ",
                   ShapeString(mean.shape()), " ", std::string(DTypeName(mean.dtype())), ", rstd ",
                   ShapeString(rstd.shape()), " ", std::string(DTypeName(rstd.dtype())), ", dy ",
                   ShapeString(dy.shape()), ", dgamma ", ShapeString(dgamma.shape()), ", dbeta ",
                   ShapeString(dbeta.shape()));
             });
  const int64_t rows = x.dim(0), c = x.dim(1);
  Tensor dx = Empty(x.dtype(), x.shape());
  const float* px = Data(x);
  const float* pg = Data(gamma);
  const float* pmean = Data(mean);
  const float* prstd = Data(rstd);
  const float* pdy = Data(dy);
  float* pdx = Data(dx);
  float* pdg = Data(dgamma);
  float* pdb = Data(dbeta);
  const float inv_c = c > 0 ? 1.0f / static_cast<float>(c) : 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = px + r * c;
    const float* g = pdy + r * c;
    const float m = pmean[r], s = prstd[r];
    // dx = rstd · (dxhat − mean(dxhat) − xhat · mean(dxhat · xhat)), dxhat = dy · gamma.
    float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
    for (int64_t i = 0; i < c; ++i) {
      const float xhat = (row[i] - m) * s;
      const float dxhat = g[i] * pg[i];
      sum_dxhat += dxhat;
      sum_dxhat_xhat += dxhat * xhat;
      pdg[i] += g[i] * xhat;
      pdb[i] += g[i];
    }
    const float mean_dxhat = sum_dxhat * inv_c;
    const float mean_dxhat_xhat = sum_dxhat_xhat * inv_c;
    float* out = pdx + r * c;
    for (int64_t i = 0; i < c; ++i) {
      const float xhat = (row[i] - m) * s;
      out[i] = s * (g[i] * pg[i] - mean_dxhat - xhat * mean_dxhat_xhat);
    }
  }
  RoundTo(dx.dtype(), pdx, dx.numel());
  RoundTo(dgamma.dtype(), pdg, dgamma.numel());
  RoundTo(dbeta.dtype(), pdb, dbeta.numel());
  return dx;
}

}  // namespace zo::backend::cpu
