// AccumulateGradient and ComputeGradStats on every kernel path: the
// accumulated values bit for bit (one correctly rounded fp32 add, so every
// path must give the same bits), the sum of squares against a long double
// reference, and the non-finite flag wherever the bad value sits in a vector.
//
// Sum-of-squares bound: every square of an fp32 value is exact in double (48
// significant bits), so the only error is the n - 1 double additions, at most
// n * 2^-53 of the sum in any order; we assert n * 2^-52.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/cpu_features.h"
#include "gtest/gtest.h"
#include "offload/optimizer_kernels.h"
#include "offload/optimizer_kernels_test_util.h"

namespace zo {

namespace {

using kernel_testing::GradBuffer;
using kernel_testing::GuardedBuffer;
using kernel_testing::SameBits;

constexpr DType kTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
constexpr size_t kLengths[] = {0, 1, 15, 17, 1023, 4099};

class GradStatsTest : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override {
    if (!SimdLevelSupported(GetParam())) {
      GTEST_SKIP() << SimdLevelName(GetParam()) << " not supported";
    }
  }
};

// Finite values spread over many binades (fp16 subnormals included).
void FillRandom(GradBuffer& buf, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> log_mag(std::log(1e-7), std::log(3e4));
  for (size_t i = 0; i < n; ++i) {
    const double x = std::exp(log_mag(rng)) * (rng() % 2 ? 1 : -1);
    buf.Set(i, static_cast<float>(x));
  }
}

long double SumSquares(const float* x, size_t n) {
  long double s = 0;
  for (size_t i = 0; i < n; ++i) s += static_cast<long double>(x[i]) * x[i];
  return s;
}

void ExpectSumNear(double got, long double want, size_t n) {
  const long double tol = static_cast<long double>(n) * 0x1p-52 * want;
  EXPECT_LE(std::fabs(static_cast<long double>(got) - want), tol)
      << "sum " << got << " want " << static_cast<double>(want);
}

TEST_P(GradStatsTest, SumOfSquaresMatchesReference) {
  for (DType type : kTypes) {
    for (size_t n : kLengths) {
      SCOPED_TRACE(::testing::Message() << DTypeName(type) << " n=" << n);
      GradBuffer src(type, n, 1);
      FillRandom(src, n, static_cast<uint32_t>(n));
      std::vector<float> decoded(n);
      for (size_t i = 0; i < n; ++i) decoded[i] = static_cast<float>(src.Get(i));
      const GradStats stats = ComputeGradStats(src.ptr(), n, GetParam());
      EXPECT_FALSE(stats.non_finite);
      ExpectSumNear(stats.sum_squares, SumSquares(decoded.data(), n), n);
    }
  }
}

// acc = (overwrite ? 0 : acc) + src, bit for bit, with the statistics of the
// resulting acc; without a stats pointer the values are the same.
TEST_P(GradStatsTest, AccumulateOverwriteAndAdd) {
  for (DType type : kTypes) {
    for (size_t n : kLengths) {
      for (bool overwrite : {true, false}) {
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(type) << " n=" << n << " overwrite=" << overwrite);
        GradBuffer src(type, n, 1);
        FillRandom(src, n, static_cast<uint32_t>(3 * n + 1));
        std::mt19937 rng(static_cast<uint32_t>(n));
        std::uniform_real_distribution<float> unit(-100.0f, 100.0f);
        GuardedBuffer<float> acc(n, 3), acc_no_stats(n, 1);
        std::vector<float> want(n);
        for (size_t i = 0; i < n; ++i) {
          const float x = static_cast<float>(src.Get(i));
          // Every 5th element cancels exactly; every 11th holds an Inf that
          // an overwrite must drop (the add case keeps it finite here).
          acc[i] = i % 5 == 0 ? -x : i % 11 == 0 && overwrite ? INFINITY : unit(rng);
          acc_no_stats[i] = acc[i];
          want[i] = overwrite ? x : acc[i] + x;
        }
        GradStats stats{123.0, true};  // must be reset
        AccumulateGradient(src.ptr(), acc.data(), n, overwrite, &stats, GetParam());
        AccumulateGradient(src.ptr(), acc_no_stats.data(), n, overwrite, nullptr, GetParam());
        for (size_t i = 0; i < n; ++i) {
          ASSERT_TRUE(SameBits(acc[i], want[i])) << i << ": " << acc[i] << " vs " << want[i];
          ASSERT_TRUE(SameBits(acc_no_stats[i], want[i])) << i;
        }
        EXPECT_FALSE(stats.non_finite);
        ExpectSumNear(stats.sum_squares, SumSquares(want.data(), n), n);
        EXPECT_TRUE(acc.GuardsIntact() && acc_no_stats.GuardsIntact());
      }
    }
  }
}

// The statistics are those of the accumulated values, not of the
// contribution: finite + finite can overflow, Inf in acc survives an add.
TEST_P(GradStatsTest, StatsDescribeTheAccumulatedResult) {
  constexpr size_t n = 40;
  const float big = std::numeric_limits<float>::max();
  std::vector<float> src(n, 1.0f), acc(n, 0.0f);
  acc[25] = big;
  src[25] = big;  // big + big = Inf
  GradStats stats;
  AccumulateGradient({src.data(), DType::kFloat32}, acc.data(), n, false, &stats, GetParam());
  EXPECT_TRUE(std::isinf(acc[25]));
  EXPECT_TRUE(stats.non_finite);
  EXPECT_FALSE(ComputeGradStats({src.data(), DType::kFloat32}, n, GetParam()).non_finite);

  std::vector<float> acc2(n, 0.0f);
  acc2[38] = -INFINITY;  // in the tail of both vector widths
  AccumulateGradient({src.data(), DType::kFloat32}, acc2.data(), n, false, &stats, GetParam());
  EXPECT_TRUE(stats.non_finite);
  // The overwrite drops acc's Inf; the largest float's square fits a double.
  AccumulateGradient({src.data(), DType::kFloat32}, acc2.data(), n, true, &stats, GetParam());
  EXPECT_FALSE(stats.non_finite);
  EXPECT_DOUBLE_EQ(stats.sum_squares, 39.0 + static_cast<double>(big) * big);

  // Largest finite values are not flagged.
  std::vector<uint16_t> half(n, 0x7BFF), bf16(n, 0xFF7F);  // 65504, -max bf16
  EXPECT_FALSE(ComputeGradStats({half.data(), DType::kFloat16}, n, GetParam()).non_finite);
  EXPECT_FALSE(ComputeGradStats({bf16.data(), DType::kBFloat16}, n, GetParam()).non_finite);
}

// A NaN or Inf at the first element, the middle and the last element of a
// SIMD vector (16 and 8 lanes), and in the tail, for each encoding.
TEST_P(GradStatsTest, NonFiniteDetectedAnywhere) {
  constexpr size_t n = 4099;  // 256 vectors of 16 (512 of 8) and a tail of 3
  const size_t positions[] = {0, 7, 8, 15, 16, 16 * 100 + 9, 4095, 4096, 4098};
  struct Bad {
    DType type;
    uint32_t bits;  // fp32 pattern, or the 16-bit encoding
  };
  const Bad bads[] = {
      {DType::kFloat32, 0x7FC00000}, {DType::kFloat32, 0xFFC00001}, {DType::kFloat32, 0x7F800001},
      {DType::kFloat32, 0x7F800000}, {DType::kFloat32, 0xFF800000}, {DType::kFloat16, 0x7C00},
      {DType::kFloat16, 0xFC00},     {DType::kFloat16, 0x7E00},     {DType::kFloat16, 0x7C01},
      {DType::kFloat16, 0xFFFF},     {DType::kBFloat16, 0x7F80},    {DType::kBFloat16, 0xFF80},
      {DType::kBFloat16, 0x7FC0},    {DType::kBFloat16, 0x7F81},
  };
  for (const Bad& bad : bads) {
    GradBuffer src(bad.type, n, 1);
    FillRandom(src, n, 7);
    for (size_t pos : positions) {
      SCOPED_TRACE(::testing::Message() << DTypeName(bad.type) << " bits 0x" << std::hex << bad.bits
                                        << std::dec << " at " << pos);
      const double saved = src.Get(pos);
      if (bad.type == DType::kFloat32) {
        src.Set(pos, std::bit_cast<float>(bad.bits));
      } else {
        src.SetBits(pos, static_cast<uint16_t>(bad.bits));
      }
      EXPECT_TRUE(ComputeGradStats(src.ptr(), n, GetParam()).non_finite);
      for (bool overwrite : {true, false}) {
        std::vector<float> acc(n, 0.5f);
        GradStats stats;
        AccumulateGradient(src.ptr(), acc.data(), n, overwrite, &stats, GetParam());
        EXPECT_TRUE(stats.non_finite) << "overwrite=" << overwrite;
        EXPECT_FALSE(std::isfinite(acc[pos]));
      }
      src.Set(pos, static_cast<float>(saved));
    }
    EXPECT_FALSE(ComputeGradStats(src.ptr(), n, GetParam()).non_finite);
  }
}

TEST_P(GradStatsTest, EmptyRange) {
  const GradStats s = ComputeGradStats({nullptr, DType::kFloat16}, 0, GetParam());
  EXPECT_EQ(s.sum_squares, 0.0);
  EXPECT_FALSE(s.non_finite);
  GradStats t{5.0, true};
  AccumulateGradient({nullptr, DType::kFloat32}, nullptr, 0, false, &t, GetParam());
  EXPECT_EQ(t.sum_squares, 0.0);
  EXPECT_FALSE(t.non_finite);
}

INSTANTIATE_TEST_SUITE_P(Levels, GradStatsTest, ::testing::ValuesIn(kAllSimdLevels),
                         [](const auto& info) { return std::string(SimdLevelName(info.param)); });

}  // namespace
}  // namespace zo
