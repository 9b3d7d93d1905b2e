// IEEE 754 binary16 ("fp16", "half") <-> binary32 for single values: the scalar
// reference that every SIMD path (common/convert.h) matches bit for bit, and
// the tail loop of hot kernels. Integer arithmetic only, so the result does not
// depend on MXCSR (rounding mode, FTZ/DAZ) or on -ffast-math.
//
// Rules, chosen to equal x86 F16C (VCVTPS2PH with imm8 = round-to-nearest,
// VCVTPH2PS):
// - float -> half rounds to nearest, ties to even. |x| >= 65520 (the midpoint
//   between 65504, the largest half, and 2^16) becomes +-Inf. Results below
//   2^-14 become half subnormals; |x| <= 2^-25 becomes +-0. Float subnormals
//   (all far below 2^-25) become +-0; the sign of zero is kept.
// - half -> float is exact; half subnormals become normal floats.
// - NaN stays NaN in both directions: the sign is kept, the top payload bits
//   are kept (float -> half drops the low 13 mantissa bits, half -> float
//   shifts the payload up by 13), and the quiet bit is set, so a signalling NaN
//   comes out quiet.
#ifndef ZO_COMMON_FP16_H_
#define ZO_COMMON_FP16_H_

#include <bit>
#include <cstdint>

namespace zo {

// float -> fp16 bits, round to nearest even. Pure, thread-safe.
constexpr uint16_t FloatToHalfBits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // Inf or NaN
    if (abs == 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u);
    return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  }
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520
  if (abs >= 0x38800000u) {                                              // >= 2^-14: normal half
    // Rebias the exponent (127 -> 15) in place, then round off 13 bits; a
    // carry out of the mantissa correctly bumps the exponent.
    const uint32_t rebased = abs - 0x38000000u;
    const uint32_t rounded = rebased + 0x0FFFu + ((rebased >> 13) & 1u);
    return static_cast<uint16_t>(sign | (rounded >> 13));
  }
  if (abs <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25: ties to 0
  // Half subnormal: the result counts units of 2^-24. The value is
  // mant * 2^(exp - 150), so shift mant right by 126 - exp (14..24 here).
  const uint32_t exp = abs >> 23;
  const uint32_t mant = (abs & 0x007FFFFFu) | 0x00800000u;
  const uint32_t shift = 126u - exp;
  const uint32_t truncated = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  const bool round_up = rest > halfway || (rest == halfway && (truncated & 1u) != 0);
  // A carry to 0x400 is the smallest normal half, which is exactly right.
  return static_cast<uint16_t>(sign | (truncated + (round_up ? 1u : 0u)));
}

// fp16 bits -> float, exact (NaNs quieted as above). Pure, thread-safe.
constexpr float HalfBitsToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exp = (half >> 10) & 0x1Fu;
  const uint32_t mant = half & 0x3FFu;
  if (exp == 0x1Fu) {
    if (mant == 0) return std::bit_cast<float>(sign | 0x7F800000u);
    return std::bit_cast<float>(sign | 0x7FC00000u | (mant << 13));
  }
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return std::bit_cast<float>(sign);
  // Subnormal: mant * 2^-24 with the leading one at bit p is 2^(p - 24) * 1.f,
  // i.e. float exponent field p + 103.
  const uint32_t p = static_cast<uint32_t>(std::bit_width(mant)) - 1u;
  const uint32_t frac = (mant << (23u - p)) & 0x007FFFFFu;
  return std::bit_cast<float>(sign | ((p + 103u) << 23) | frac);
}

}  // namespace zo

#endif  // ZO_COMMON_FP16_H_
