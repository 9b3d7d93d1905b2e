// bfloat16 ("bf16": the top half of a binary32) <-> binary32 for single
// values: the scalar reference that every SIMD path (common/convert.h) matches
// bit for bit, and the tail loop of hot kernels. Integer arithmetic only, so
// the result does not depend on MXCSR or on -ffast-math.
//
// Rules:
// - float -> bf16 rounds to nearest, ties to even, on all finite inputs,
//   float subnormals included (they round to bf16 subnormals or +-0; unlike
//   AVX512-BF16's VCVTNEPS2BF16, which flushes them to zero). Values that
//   round past the largest bf16 become +-Inf.
// - NaN stays NaN: sign and the top 7 payload bits kept, quiet bit (bit 6)
//   set. This is what VCVTNEPS2BF16 and PyTorch produce.
// - bf16 -> float is exact and bitwise: the 16 bits become the top half of
//   the float, NaN payloads (signalling ones included) unchanged.
#ifndef ZO_COMMON_BF16_H_
#define ZO_COMMON_BF16_H_

#include <bit>
#include <cstdint>

namespace zo {

// float -> bf16 bits, round to nearest even. Pure, thread-safe.
constexpr uint16_t FloatToBf16Bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Adding 0x7FFF plus the kept lsb rounds the low 16 bits to nearest even;
  // a carry walks into the exponent (up to Inf), which is the right result.
  const uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

// bf16 bits -> float, exact. Pure, thread-safe.
constexpr float Bf16BitsToFloat(uint16_t bf16) {
  return std::bit_cast<float>(static_cast<uint32_t>(bf16) << 16);
}

}  // namespace zo

#endif  // ZO_COMMON_BF16_H_
