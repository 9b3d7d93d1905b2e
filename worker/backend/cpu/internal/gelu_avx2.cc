// GELU kernels built with AVX2 + FMA (see gelu_kernels.inc).
#include "worker/backend/cpu/internal/gelu_kernels.h"

#define ZO_GELU_SUFFIX Avx2
#include "worker/backend/cpu/internal/gelu_kernels.inc"
