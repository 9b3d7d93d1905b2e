// Element-wise kernels of the CPU backend over fp32 arrays, one
// implementation per SIMD level (common/cpu_features.h), all from one source
// (pointwise_kernels.inc) compiled with each level's flags.
//
// GELU: Φ(x) = erfc(-x / √2) / 2 comes from a rational erfc whose relative
// error is below 1.1e-7 for every argument, so GELU keeps its relative
// accuracy (a few fp32 ulp) in the negative tail too, where 1 + erf(x / √2)
// would cancel. exp: Cody-Waite reduction and a degree-7 polynomial, within
// 2 ulp. Results agree across levels up to FMA contraction.
#ifndef ZO_WORKER_BACKEND_CPU_INTERNAL_POINTWISE_KERNELS_H_
#define ZO_WORKER_BACKEND_CPU_INTERNAL_POINTWISE_KERNELS_H_

#include <cstdint>

#include "common/cpu_features.h"

namespace zo::backend::cpu_internal {

// y[i] = x[i] Φ(x[i]).
void GeluForward(const float* x, float* y, int64_t n, SimdLevel level = ActiveSimdLevel());
// dx[i] = dy[i] (Φ(x[i]) + x[i] φ(x[i])). dx may alias dy.
void GeluBackward(const float* x, const float* dy, float* dx, int64_t n,
                  SimdLevel level = ActiveSimdLevel());

// y[i] = e^(x[i] - shift), 0 where that is below e^-87 (fp32's normal
// range). y may alias x.
void ExpShifted(const float* x, float shift, float* y, int64_t n,
                SimdLevel level = ActiveSimdLevel());

void GeluForwardScalar(const float* x, float* y, int64_t n);
void GeluBackwardScalar(const float* x, const float* dy, float* dx, int64_t n);
void ExpShiftedScalar(const float* x, float shift, float* y, int64_t n);
#if defined(__x86_64__)
void GeluForwardAvx2(const float* x, float* y, int64_t n);
void GeluBackwardAvx2(const float* x, const float* dy, float* dx, int64_t n);
void ExpShiftedAvx2(const float* x, float shift, float* y, int64_t n);
void GeluForwardAvx512(const float* x, float* y, int64_t n);
void GeluBackwardAvx512(const float* x, const float* dy, float* dx, int64_t n);
void ExpShiftedAvx512(const float* x, float shift, float* y, int64_t n);
#endif

}  // namespace zo::backend::cpu_internal

#endif  // ZO_WORKER_BACKEND_CPU_INTERNAL_POINTWISE_KERNELS_H_
