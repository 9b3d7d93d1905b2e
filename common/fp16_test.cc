#include "common/fp16.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace zo {
namespace {

static_assert(FloatToHalfBits(1.0f) == 0x3C00);
static_assert(HalfBitsToFloat(0xC000) == -2.0f);

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t b) { return std::bit_cast<float>(b); }

// The independent reference: GCC's _Float16, which on baseline x86-64 (this
// file has no -mf16c) converts through libgcc's soft-float routines.
uint16_t ReferenceToHalf(float f) { return std::bit_cast<uint16_t>(static_cast<_Float16>(f)); }
float ReferenceFromHalf(uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }

// Our documented NaN rule (equal to F16C's), spelled out independently.
uint16_t ExpectedHalfNan(uint32_t f) {
  return static_cast<uint16_t>(((f >> 16) & 0x8000u) | 0x7E00u | ((f >> 13) & 0x3FFu));
}

uint16_t ExpectedToHalf(float f) {
  return std::isnan(f) ? ExpectedHalfNan(Bits(f)) : ReferenceToHalf(f);
}

::testing::AssertionResult ToHalfMatches(float f) {
  const uint16_t got = FloatToHalfBits(f);
  const uint16_t want = ExpectedToHalf(f);
  if (got == want) return ::testing::AssertionSuccess();
  // AssertionResult formats each << separately, so std::hex must go via Message.
  return ::testing::AssertionFailure()
         << (::testing::Message() << std::hex << "float bits 0x" << Bits(f) << " -> 0x" << got
                                  << ", expected 0x" << want);
}

TEST(Fp16Test, EveryHalfConvertsExactlyAndRoundTrips) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const uint16_t half = static_cast<uint16_t>(h);
    const float f = HalfBitsToFloat(half);
    const bool half_is_nan = (half & 0x7C00) == 0x7C00 && (half & 0x3FF) != 0;
    if (half_is_nan) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_EQ(Bits(f), ((h & 0x8000u) << 16) | 0x7FC00000u | ((h & 0x3FFu) << 13))
          << std::hex << h;
      // Back again: still NaN, same sign and payload, now quiet.
      ASSERT_EQ(FloatToHalfBits(f), h | 0x200u) << std::hex << h;
    } else {
      ASSERT_EQ(Bits(f), Bits(ReferenceFromHalf(half))) << std::hex << h;
      ASSERT_EQ(FloatToHalfBits(f), half) << std::hex << h;
    }
  }
}

TEST(Fp16Test, RandomFloatBitPatternsMatchReference) {
  std::mt19937 rng(20240601);
  for (int i = 0; i < (1 << 24); ++i) {
    ASSERT_TRUE(ToHalfMatches(FromBits(static_cast<uint32_t>(rng()))));
  }
}

TEST(Fp16Test, RandomFloatsInHalfRangeMatchReference) {
  // Uniform bit patterns rarely land near the half range; aim there.
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> exp(98, 145);  // 2^-29 .. 2^18
  for (int i = 0; i < (1 << 22); ++i) {
    const uint32_t r = static_cast<uint32_t>(rng());
    const uint32_t bits = (r & 0x80000000u) | (exp(rng) << 23) | (r & 0x7FFFFFu);
    ASSERT_TRUE(ToHalfMatches(FromBits(bits)));
  }
}

TEST(Fp16Test, EveryMantissaAtBoundaryExponentsMatchesReference) {
  // 102: results 0 or 1 ulp of subnormal; 112/113: the subnormal/normal
  // boundary; 142: the overflow edge. Both signs.
  for (uint32_t exp : {102u, 112u, 113u, 142u}) {
    for (uint32_t mant = 0; mant < (1u << 23); ++mant) {
      const uint32_t bits = (exp << 23) | mant;
      ASSERT_TRUE(ToHalfMatches(FromBits(bits)));
      ASSERT_TRUE(ToHalfMatches(FromBits(bits | 0x80000000u)));
    }
  }
}

struct Case {
  uint32_t float_bits;
  uint16_t half_bits;
};

TEST(Fp16Test, TargetedValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const Case cases[] = {
      {Bits(0.0f), 0x0000},
      {Bits(-0.0f), 0x8000},
      {Bits(1.0f), 0x3C00},
      {Bits(inf), 0x7C00},
      {Bits(-inf), 0xFC00},
      // Overflow edge: 65504 is the largest half, 65520 the midpoint to 2^16.
      {Bits(65504.0f), 0x7BFF},
      {Bits(65519.99f), 0x7BFF},
      {Bits(std::nextafter(65520.0f, 0.0f)), 0x7BFF},
      {Bits(65520.0f), 0x7C00},
      {Bits(std::nextafter(65520.0f, inf)), 0x7C00},
      {Bits(-65520.0f), 0xFC00},
      {Bits(1e10f), 0x7C00},
      {Bits(std::numeric_limits<float>::max()), 0x7C00},
      // Exact ties between two halves round to the even one.
      {Bits(1.0f + 0x1p-11f), 0x3C00},
      {Bits(1.0f + 3 * 0x1p-11f), 0x3C02},
      {Bits(std::nextafter(1.0f + 0x1p-11f, inf)), 0x3C01},
      {Bits(std::nextafter(1.0f + 3 * 0x1p-11f, 0.0f)), 0x3C01},
      {Bits(-(2048.0f + 1.0f)), 0xE800},  // ulp 2 at 2048: tie to even
      {Bits(2048.0f + 3.0f), 0x6802},
      // Subnormals: 2^-24 is the smallest half, 2^-14 the smallest normal.
      {Bits(0x1p-24f), 0x0001},
      {Bits(-0x1p-24f), 0x8001},
      {Bits(0x1p-25f), 0x0000},  // tie between 0 and 2^-24
      {Bits(-0x1p-25f), 0x8000},
      {Bits(std::nextafter(0x1p-25f, inf)), 0x0001},
      {Bits(3 * 0x1p-25f), 0x0002},  // tie between 1 and 2 ulps
      {Bits(5 * 0x1p-25f), 0x0002},  // tie between 2 and 3 ulps
      {Bits(0x1p-14f), 0x0400},
      {Bits(0x1p-14f - 0x1p-24f), 0x03FF},
      {Bits(0x1p-14f - 0x1p-25f), 0x0400},  // tie between 0x3FF and 0x400
      {Bits(0x1p-14f - 3 * 0x1p-26f), 0x03FF},
      {Bits(std::numeric_limits<float>::min()), 0x0000},
      {Bits(std::numeric_limits<float>::denorm_min()), 0x0000},
      {Bits(-std::numeric_limits<float>::denorm_min()), 0x8000},
      // NaNs: sign and top payload bits kept, quiet bit set.
      {0x7FC00000u, 0x7E00},
      {0xFFC00000u, 0xFE00},
      {0x7F800001u, 0x7E00},  // signalling, payload only in the dropped bits
      {0xFFA00000u, 0xFF00},  // signalling, payload kept
      {0x7F802000u, 0x7E01},
      {0x7FFFFFFFu, 0x7FFF},
      {0xFFC12345u, 0xFE09},
  };
  for (const Case& c : cases) {
    const float f = FromBits(c.float_bits);
    EXPECT_EQ(FloatToHalfBits(f), c.half_bits) << std::hex << "float bits 0x" << c.float_bits;
    EXPECT_TRUE(ToHalfMatches(f));
  }
}

TEST(Fp16Test, HalfToFloatTargetedValues) {
  EXPECT_EQ(HalfBitsToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(HalfBitsToFloat(0x03FF), 0x1p-14f - 0x1p-24f);
  EXPECT_EQ(HalfBitsToFloat(0x0400), 0x1p-14f);
  EXPECT_EQ(HalfBitsToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(Bits(HalfBitsToFloat(0x8000)), 0x80000000u);
  EXPECT_EQ(HalfBitsToFloat(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(Bits(HalfBitsToFloat(0x7C01)), 0x7FC02000u);  // signalling NaN comes out quiet
  EXPECT_EQ(Bits(HalfBitsToFloat(0xFE00)), 0xFFC00000u);
}

}  // namespace
}  // namespace zo
