// Element-wise ops: GELU (erf form, kernels in internal/pointwise_kernels.h),
// ReLU, the residual add, y += x, the weights a delayed step computes on.
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "worker/backend/cpu/internal/cpu_backend_impl.h"
#include "worker/backend/cpu/internal/pointwise_kernels.h"

namespace zo::backend::cpu {
namespace {

void CheckSameShape(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                    const Tensor& b) {
  CheckShape(a.shape() == b.shape(), op, [&] {
    return absl::StrCat(a_name, " ", ShapeString(a.shape()), ", ", b_name, " ",
                        ShapeString(b.shape()));
  });
}

// out[i] = f(x[i]); `out` has x's shape (callers round it to its dtype).
template <typename F>
void Map(const Tensor& x, Tensor& out, F f) {
  const float* px = Data(x);
  float* po = Data(out);
  for (int64_t i = 0, n = x.numel(); i < n; ++i) po[i] = f(px[i]);
}

// out[i] = f(a[i], b[i]); a, b and `out` have one shape (out may be a or b).
template <typename F>
void Zip(const Tensor& a, const Tensor& b, Tensor& out, F f) {
  const float* pa = Data(a);
  const float* pb = Data(b);
  float* po = Data(out);
  for (int64_t i = 0, n = a.numel(); i < n; ++i) po[i] = f(pa[i], pb[i]);
}

}  // namespace

Tensor CpuBackend::Gelu(const Tensor& x) {
  Tensor y = Empty(x.dtype(), x.shape());
  cpu_internal::GeluForward(Data(x), Data(y), y.numel());
  RoundTo(y.dtype(), Data(y), y.numel());
  return y;
}

Tensor CpuBackend::GeluBackward(const Tensor& x, const Tensor& dy) {
  CheckSameShape("GeluBackward", "x", x, "dy", dy);
  Tensor dx = Empty(x.dtype(), x.shape());
  cpu_internal::GeluBackward(Data(x), Data(dy), Data(dx), dx.numel());
  RoundTo(dx.dtype(), Data(dx), dx.numel());
  return dx;
}

Tensor CpuBackend::Relu(const Tensor& x) {
  Tensor y = Empty(x.dtype(), x.shape());
  Map(x, y, [](float v) { return v > 0.0f ? v : 0.0f; });
  return y;  // already representable: each value is an input or zero
}

Tensor CpuBackend::ReluBackward(const Tensor& x, const Tensor& dy) {
  CheckSameShape("ReluBackward", "x", x, "dy", dy);
  Tensor dx = Empty(x.dtype(), x.shape());
  Zip(x, dy, dx, [](float v, float g) { return v > 0.0f ? g : 0.0f; });
  RoundTo(dx.dtype(), Data(dx), dx.numel());  // dy may be stored wider than x
  return dx;
}

Tensor CpuBackend::Add(const Tensor& a, const Tensor& b) {
  CheckSameShape("Add", "a", a, "b", b);
  Tensor y = Empty(a.dtype(), a.shape());
  Zip(a, b, y, [](float u, float v) { return u + v; });
  RoundTo(y.dtype(), Data(y), y.numel());
  return y;
}

void CpuBackend::AddInto(const Tensor& x, Tensor& y) {
  CheckSameShape("AddInto", "x", x, "y", y);
  Zip(y, x, y, [](float u, float v) { return u + v; });
  RoundTo(y.dtype(), Data(y), y.numel());
}

void CpuBackend::CombineWeights(const Tensor& last, const Tensor& before, const Tensor& grad,
                                float a, float b, float c, Tensor& out) {
  CheckSameShape("CombineWeights", "last", last, "out", out);
  if (before.defined()) CheckSameShape("CombineWeights", "last", last, "before", before);
  if (grad.defined()) CheckSameShape("CombineWeights", "last", last, "grad", grad);
  const float* pl = Data(last);
  const float* pb = before.defined() ? Data(before) : nullptr;
  const float* pg = grad.defined() ? Data(grad) : nullptr;
  float* po = Data(out);
  for (int64_t i = 0, n = last.numel(); i < n; ++i) {
    float w = a * pl[i];
    if (pb != nullptr) w = std::fma(b, pb[i], w);
    if (pg != nullptr) w = std::fma(-c, pg[i], w);
    po[i] = w;
  }
  RoundTo(out.dtype(), po, out.numel());
}

}  // namespace zo::backend::cpu
