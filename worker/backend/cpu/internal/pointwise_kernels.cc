// The baseline element-wise kernels and the dispatch by SIMD level.
#include "worker/backend/cpu/internal/pointwise_kernels.h"

#define ZO_POINTWISE_SUFFIX Scalar
#include "worker/backend/cpu/internal/pointwise_kernels.inc"

namespace zo::backend::cpu_internal {

// SIMD kernels exist only on x86-64; elsewhere only kScalar is supported.
void GeluForward(const float* x, float* y, int64_t n, SimdLevel level) {
  switch (level) {
#if defined(__x86_64__)
    case SimdLevel::kAvx2:
      return GeluForwardAvx2(x, y, n);
    case SimdLevel::kAvx512:
      return GeluForwardAvx512(x, y, n);
#endif
    default:
      return GeluForwardScalar(x, y, n);
  }
}

void GeluBackward(const float* x, const float* dy, float* dx, int64_t n, SimdLevel level) {
  switch (level) {
#if defined(__x86_64__)
    case SimdLevel::kAvx2:
      return GeluBackwardAvx2(x, dy, dx, n);
    case SimdLevel::kAvx512:
      return GeluBackwardAvx512(x, dy, dx, n);
#endif
    default:
      return GeluBackwardScalar(x, dy, dx, n);
  }
}

void ExpShifted(const float* x, float shift, float* y, int64_t n, SimdLevel level) {
  switch (level) {
#if defined(__x86_64__)
    case SimdLevel::kAvx2:
      return ExpShiftedAvx2(x, shift, y, n);
    case SimdLevel::kAvx512:
      return ExpShiftedAvx512(x, shift, y, n);
#endif
    default:
      return ExpShiftedScalar(x, shift, y, n);
  }
}

}  // namespace zo::backend::cpu_internal
