#include "common/bf16.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace zo {
namespace {

static_assert(FloatToBf16Bits(1.0f) == 0x3F80);
static_assert(Bf16BitsToFloat(0xC000) == -2.0f);

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t b) { return std::bit_cast<float>(b); }

// The independent reference: of the two bf16 values around |f|, the nearer
// one by distances measured in double (exact here), ties to the even one.
// Past the largest bf16 the upper candidate is 2^128, as if the exponent went
// on, whose encoding is Inf.
uint16_t SlowReferenceBf16(float f) {
  if (std::isnan(f)) return static_cast<uint16_t>((Bits(f) >> 16) | 0x40u);  // documented rule
  const uint16_t sign = static_cast<uint16_t>((Bits(f) >> 16) & 0x8000u);
  const double x = std::fabs(static_cast<double>(f));
  if (std::isinf(x)) return sign | 0x7F80u;
  const uint16_t below = static_cast<uint16_t>(Bits(static_cast<float>(x)) >> 16);
  const uint16_t above = static_cast<uint16_t>(below + 1);
  const double lo = FromBits(static_cast<uint32_t>(below) << 16);
  const double hi =
      above == 0x7F80 ? std::ldexp(1.0, 128) : FromBits(static_cast<uint32_t>(above) << 16);
  const double to_lo = x - lo;
  const double to_hi = hi - x;
  uint16_t pick;
  if (to_lo < to_hi) {
    pick = below;
  } else if (to_hi < to_lo) {
    pick = above;
  } else {
    pick = (below & 1) == 0 ? below : above;
  }
  return sign | pick;
}

::testing::AssertionResult ToBf16Matches(float f) {
  const uint16_t got = FloatToBf16Bits(f);
  const uint16_t want = SlowReferenceBf16(f);
  if (got == want) return ::testing::AssertionSuccess();
  // AssertionResult formats each << separately, so std::hex must go via Message.
  return ::testing::AssertionFailure()
         << (::testing::Message() << std::hex << "float bits 0x" << Bits(f) << " -> 0x" << got
                                  << ", expected 0x" << want);
}

TEST(Bf16Test, EveryBf16ConvertsExactlyAndRoundTrips) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const uint16_t bf = static_cast<uint16_t>(b);
    const float f = Bf16BitsToFloat(bf);
    ASSERT_EQ(Bits(f), b << 16);  // exact, NaN payloads included
    const bool is_nan = (b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0;
    if (is_nan) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      ASSERT_EQ(FloatToBf16Bits(f), b | 0x40u) << std::hex << b;  // quiet, sign and payload kept
    } else {
      ASSERT_EQ(FloatToBf16Bits(f), bf) << std::hex << b;
    }
  }
}

TEST(Bf16Test, RandomFloatBitPatternsMatchReference) {
  std::mt19937 rng(20240602);
  for (int i = 0; i < (1 << 24); ++i) {
    ASSERT_TRUE(ToBf16Matches(FromBits(static_cast<uint32_t>(rng()))));
  }
}

TEST(Bf16Test, EveryLowHalfUnderBoundaryPrefixesMatchesReference) {
  // The low 16 bits decide the rounding; run them all under the prefixes
  // where it matters most (zero/subnormal, subnormal/normal, 1.0, overflow).
  const uint32_t prefixes[] = {0x0000, 0x0001, 0x007E, 0x007F, 0x0080, 0x3F80, 0x3F81,
                               0x7F7E, 0x7F7F, 0x8000, 0x807F, 0xBF80, 0xFF7F};
  for (uint32_t prefix : prefixes) {
    for (uint32_t low = 0; low <= 0xFFFF; ++low) {
      ASSERT_TRUE(ToBf16Matches(FromBits((prefix << 16) | low)));
    }
  }
}

struct Case {
  uint32_t float_bits;
  uint16_t bf16_bits;
};

TEST(Bf16Test, TargetedValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const Case cases[] = {
      {Bits(0.0f), 0x0000},
      {Bits(-0.0f), 0x8000},
      {Bits(1.0f), 0x3F80},
      {Bits(inf), 0x7F80},
      {Bits(-inf), 0xFF80},
      // Exact ties between two bf16s round to the even one.
      {Bits(1.0f + 0x1p-8f), 0x3F80},
      {Bits(1.0f + 3 * 0x1p-8f), 0x3F82},
      {Bits(-(1.0f + 0x1p-8f)), 0xBF80},
      {Bits(std::nextafter(1.0f + 0x1p-8f, inf)), 0x3F81},
      {Bits(std::nextafter(1.0f + 3 * 0x1p-8f, 0.0f)), 0x3F81},
      // Overflow: the largest bf16 is 0x7F7F; the midpoint above it is a tie
      // with an odd lower neighbour, so it goes to Inf.
      {0x7F7F7FFFu, 0x7F7F},
      {0x7F7F8000u, 0x7F80},
      {Bits(std::numeric_limits<float>::max()), 0x7F80},
      {0xFF7FFFFFu, 0xFF80},
      // fp32 subnormals round like any other value (no flush to zero).
      {Bits(std::numeric_limits<float>::denorm_min()), 0x0000},
      {0x00008000u, 0x0000},  // tie with 0
      {0x00008001u, 0x0001},
      {0x00018000u, 0x0002},  // tie, odd lower neighbour
      {0x00010000u, 0x0001},  // smallest bf16 subnormal
      {0x807FFFFFu, 0x8080},  // largest subnormal rounds up to the smallest normal
      {0x007F7FFFu, 0x007F},
      {Bits(std::numeric_limits<float>::min()), 0x0080},
      // NaNs: sign and top payload bits kept, quiet bit set.
      {0x7FC00000u, 0x7FC0},
      {0x7F800001u, 0x7FC0},  // signalling, payload only in the dropped bits
      {0xFFA00000u, 0xFFE0},
      {0x7F810000u, 0x7FC1},
      {0x7FFFFFFFu, 0x7FFF},
      {0xFFC12345u, 0xFFC1},
  };
  for (const Case& c : cases) {
    const float f = FromBits(c.float_bits);
    EXPECT_EQ(FloatToBf16Bits(f), c.bf16_bits) << std::hex << "float bits 0x" << c.float_bits;
    EXPECT_TRUE(ToBf16Matches(f));
  }
}

}  // namespace
}  // namespace zo
