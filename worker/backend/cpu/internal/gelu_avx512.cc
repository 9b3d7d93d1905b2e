// GELU kernels built with AVX-512 (see gelu_kernels.inc).
#include "worker/backend/cpu/internal/gelu_kernels.h"

#define ZO_GELU_SUFFIX Avx512
#include "worker/backend/cpu/internal/gelu_kernels.inc"
