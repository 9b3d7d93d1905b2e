// Per-ISA conversion kernels behind common/convert.h. Each is defined in a
// file compiled with that ISA's -m flags (convert_avx2.cc, convert_avx512.cc);
// call one only when SimdLevelSupported() says the host can run it.
//
// Rule for those files: include nothing but <immintrin.h>, C headers and this
// header, and keep every helper in an anonymous namespace. An inline function
// or template from a shared header would be emitted there with AVX code, and
// the linker may keep that copy for baseline callers too (SIGILL on older
// CPUs).
//
// Contracts as in common/convert.h: any n (0 included), no alignment needed,
// src and dst must not overlap; thread-safe.
#ifndef ZO_COMMON_INTERNAL_CONVERT_KERNELS_H_
#define ZO_COMMON_INTERNAL_CONVERT_KERNELS_H_

#include <stddef.h>
#include <stdint.h>

namespace zo::common_internal {

// AVX2 + F16C. bf16 rounding is done with integer arithmetic.
void FloatToHalfAvx2(const float* src, uint16_t* dst, size_t n);
void HalfToFloatAvx2(const uint16_t* src, float* dst, size_t n);
void FloatToBf16Avx2(const float* src, uint16_t* dst, size_t n);
void Bf16ToFloatAvx2(const uint16_t* src, float* dst, size_t n);

// AVX-512 F/BW/VL/DQ + F16C, masked tails.
void FloatToHalfAvx512(const float* src, uint16_t* dst, size_t n);
void HalfToFloatAvx512(const uint16_t* src, float* dst, size_t n);
// use_bf16_insn selects VCVTNEPS2BF16 (host must have AVX512-BF16), with the
// fp32-subnormal and NaN lanes redone in integer arithmetic;
// false uses the integer path for every lane.
void FloatToBf16Avx512(const float* src, uint16_t* dst, size_t n, bool use_bf16_insn);
void Bf16ToFloatAvx512(const uint16_t* src, float* dst, size_t n);

}  // namespace zo::common_internal

#endif  // ZO_COMMON_INTERNAL_CONVERT_KERNELS_H_
