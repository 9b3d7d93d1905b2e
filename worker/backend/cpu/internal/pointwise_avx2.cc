// The element-wise kernels built with AVX2 + FMA (see pointwise_kernels.inc).
#include "worker/backend/cpu/internal/pointwise_kernels.h"

#define ZO_POINTWISE_SUFFIX Avx2
#include "worker/backend/cpu/internal/pointwise_kernels.inc"
