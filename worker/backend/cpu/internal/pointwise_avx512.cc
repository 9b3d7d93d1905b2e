// The element-wise kernels built with AVX-512 (see pointwise_kernels.inc).
#include "worker/backend/cpu/internal/pointwise_kernels.h"

#define ZO_POINTWISE_SUFFIX Avx512
#include "worker/backend/cpu/internal/pointwise_kernels.inc"
