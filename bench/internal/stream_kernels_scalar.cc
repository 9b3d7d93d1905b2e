// STREAM-style baseline compiled for the scalar path (flags in bench/CMakeLists.txt).
#include "bench/internal/stream_kernels.h"

#define ZO_STREAM_SUFFIX Scalar
#include "bench/internal/stream_kernels.inc"
