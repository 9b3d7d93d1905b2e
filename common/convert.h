// Bulk fp32 <-> fp16 / bf16 conversion over buffers, dispatched at run time to
// the best SIMD level (ActiveSimdLevel(), see common/cpu_features.h). Every
// level gives results bit-identical to the scalar reference in common/fp16.h
// and common/bf16.h (round to nearest even, NaN and subnormal rules there).
//
//   std::vector<uint16_t> half(n);
//   zo::FloatToHalf(master.data(), half.data(), n);
//
// Contracts for all functions here: `src` holds n readable elements and `dst`
// n writable ones (nothing else is touched); n may be 0 (pointers are then
// not dereferenced); no alignment is required, not even to the element size;
// `src` and `dst` must not overlap. Thread-safe: distinct calls on disjoint
// buffers may run concurrently. Results do not depend on MXCSR.
#ifndef ZO_COMMON_CONVERT_H_
#define ZO_COMMON_CONVERT_H_

#include <cstddef>
#include <cstdint>

#include "common/cpu_features.h"
#include "common/dtype.h"

namespace zo {

// Dispatched on ActiveSimdLevel().
void FloatToHalf(const float* src, uint16_t* dst, size_t n);
void HalfToFloat(const uint16_t* src, float* dst, size_t n);
void FloatToBf16(const float* src, uint16_t* dst, size_t n);
void Bf16ToFloat(const uint16_t* src, float* dst, size_t n);

// fp32 -> `dtype` (kFloat16, kBFloat16, or kFloat32: a copy), dispatched as
// above; `dst` holds n elements of dtype.
void FloatToDType(const float* src, DType dtype, void* dst, size_t n);

// The same at an explicit level, for tests and benchmarks. Precondition:
// SimdLevelSupported(level); otherwise the process may die of SIGILL
// (debug builds assert).
void FloatToHalf(const float* src, uint16_t* dst, size_t n, SimdLevel level);
void HalfToFloat(const uint16_t* src, float* dst, size_t n, SimdLevel level);
void FloatToBf16(const float* src, uint16_t* dst, size_t n, SimdLevel level);
void Bf16ToFloat(const uint16_t* src, float* dst, size_t n, SimdLevel level);

}  // namespace zo

#endif  // ZO_COMMON_CONVERT_H_
