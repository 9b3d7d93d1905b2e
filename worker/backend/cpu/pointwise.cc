// Element-wise ops: GELU (erf form), ReLU, the residual add, y += x.
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "worker/backend/cpu/internal/cpu_backend_impl.h"

namespace zo::backend::cpu {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

void CheckSameShape(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                    const Tensor& b) {
  CheckShape(a.shape() == b.shape(), op, [&] {
    return absl::StrCat(a_name, " ", ShapeString(a.shape()), ", ", b_name, " ",
                        ShapeString(b.shape()));
  });
}

}  // namespace

Tensor CpuBackend::Gelu(const Tensor& x) {
  Tensor y = Empty(x.dtype(), x.shape());
  const float* px = Data(x);
  float* py = Data(y);
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) py[i] = 0.5f * px[i] * (1.0f + std::erf(px[i] * kInvSqrt2));
  RoundTo(y.dtype(), py, n);
  return y;
}

Tensor CpuBackend::GeluBackward(const Tensor& x, const Tensor& dy) {
  CheckSameShape("GeluBackward", "x", x, "dy", dy);
  Tensor dx = Empty(x.dtype(), x.shape());
  const float* px = Data(x);
  const float* pdy = Data(dy);
  float* pdx = Data(dx);
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v = px[i];
    const float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
    pdx[i] = pdy[i] * (cdf + v * pdf);
  }
  RoundTo(dx.dtype(), pdx, n);
  return dx;
}

Tensor CpuBackend::Relu(const Tensor& x) {
  Tensor y = Empty(x.dtype(), x.shape());
  const float* px = Data(x);
  float* py = Data(y);
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) py[i] = px[i] > 0.0f ? px[i] : 0.0f;
  return y;  // already representable: each value is an input or zero
}

Tensor CpuBackend::ReluBackward(const Tensor& x, const Tensor& dy) {
  CheckSameShape("ReluBackward", "x", x, "dy", dy);
  Tensor dx = Empty(x.dtype(), x.shape());
  const float* px = Data(x);
  const float* pdy = Data(dy);
  float* pdx = Data(dx);
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) pdx[i] = px[i] > 0.0f ? pdy[i] : 0.0f;
  RoundTo(dx.dtype(), pdx, n);  // dy may be stored wider than x
  return dx;
}

Tensor CpuBackend::Add(const Tensor& a, const Tensor& b) {
  CheckSameShape("Add", "a", a, "b", b);
  Tensor y = Empty(a.dtype(), a.shape());
  const float* pa = Data(a);
  const float* pb = Data(b);
  float* py = Data(y);
  const int64_t n = a.numel();
  for (int64_t i = 0; i < n; ++i) py[i] = pa[i] + pb[i];
  RoundTo(y.dtype(), py, n);
  return y;
}

void CpuBackend::AddInto(const Tensor& x, Tensor& y) {
  CheckSameShape("AddInto", "x", x, "y", y);
  const float* px = Data(x);
  float* py = Data(y);
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) py[i] += px[i];
  RoundTo(y.dtype(), py, n);
}

}  // namespace zo::backend::cpu
