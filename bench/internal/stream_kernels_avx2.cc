// STREAM-style baseline compiled for the avx2 path (flags in bench/CMakeLists.txt).
#include "bench/internal/stream_kernels.h"

#define ZO_STREAM_SUFFIX Avx2
#include "bench/internal/stream_kernels.inc"
