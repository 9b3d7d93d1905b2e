// The element-wise kernels at every SIMD level this CPU runs, against double
// references over a dense sweep of inputs, the tails and special values.
#include "worker/backend/cpu/internal/pointwise_kernels.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace zo::backend::cpu_internal {
namespace {

double Phi(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double PhiDensity(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI); }

// Every step of 1/1024 in [-30, 30], plus values near 0 and huge ones.
std::vector<float> Sweep() {
  std::vector<float> x;
  for (int i = -30 * 1024; i <= 30 * 1024; ++i) x.push_back(static_cast<float>(i) / 1024.0f);
  for (float v : {1e-30f, 1e-20f, 1e-10f, 1e-7f, 3e-4f, 0.1f, 1e2f, 1e6f, 1e30f, 3e38f}) {
    x.push_back(v);
    x.push_back(-v);
  }
  return x;
}

class PointwiseKernelsTest : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override {
    if (!SimdLevelSupported(GetParam())) GTEST_SKIP() << "this CPU cannot run the level";
  }
};

// Relative 4e-7 (a few fp32 ulp) of the value itself, down to where fp32
// goes subnormal: the erfc form has no cancellation in the negative tail.
TEST_P(PointwiseKernelsTest, ForwardMatchesDoubleReference) {
  const std::vector<float> x = Sweep();
  std::vector<float> y(x.size());
  GeluForward(x.data(), y.data(), static_cast<int64_t>(x.size()), GetParam());
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = x[i] * Phi(x[i]);
    const double err = std::abs(y[i] - want);
    worst = std::max(worst, err / std::max(std::abs(want), 1e-30));
    if (!(err <= 4e-7 * std::abs(want) + 1e-37) && ++bad <= 5) {
      ADD_FAILURE() << "gelu(" << x[i] << ") = " << y[i] << ", want " << want;
    }
  }
  EXPECT_EQ(bad, 0);
  RecordProperty("worst_relative_error", std::to_string(worst));
}

// The derivative Φ + x φ crosses zero near x = -0.75, so the bound is
// relative to the sizes of its two terms (what fp32 can resolve there).
TEST_P(PointwiseKernelsTest, BackwardMatchesDoubleReference) {
  const std::vector<float> x = Sweep();
  std::vector<float> dy(x.size());
  for (size_t i = 0; i < x.size(); ++i) dy[i] = i % 3 == 0 ? 1.0f : -0.375f;
  std::vector<float> dx(x.size());
  GeluBackward(x.data(), dy.data(), dx.data(), static_cast<int64_t>(x.size()), GetParam());
  int bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double cdf = Phi(x[i]), xpdf = x[i] * PhiDensity(x[i]);
    const double want = dy[i] * (cdf + xpdf);
    const double scale = std::abs(dy[i]) * (std::abs(cdf) + std::abs(xpdf));
    if (!(std::abs(dx[i] - want) <= 4e-7 * scale + 1e-37) && ++bad <= 5) {
      ADD_FAILURE() << "gelu'(" << x[i] << ") * " << dy[i] << " = " << dx[i] << ", want " << want;
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST_P(PointwiseKernelsTest, BackwardInPlaceOverDy) {
  const std::vector<float> x = {-3.0f, -0.5f, 0.0f, 0.75f, 2.0f, 9.0f, -1.0f, 0.25f, 4.0f};
  std::vector<float> want(x.size()), g(x.size(), 2.0f);
  GeluBackward(x.data(), g.data(), want.data(), static_cast<int64_t>(x.size()), GetParam());
  GeluBackward(x.data(), g.data(), g.data(), static_cast<int64_t>(x.size()), GetParam());
  EXPECT_EQ(g, want);
}

TEST_P(PointwiseKernelsTest, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {0.0f, -0.0f, inf, std::numeric_limits<float>::quiet_NaN()};
  std::vector<float> y(x.size());
  GeluForward(x.data(), y.data(), static_cast<int64_t>(x.size()), GetParam());
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[2], inf);
  EXPECT_TRUE(std::isnan(y[3]));
}

// 2 ulp of the value in fp32's normal range; below e^-87 it flushes to 0.
TEST_P(PointwiseKernelsTest, ExpShiftedMatchesDoubleReference) {
  std::vector<float> x;
  for (int i = -100 * 256; i <= 88 * 256; ++i) x.push_back(static_cast<float>(i) / 256.0f);
  for (const float shift : {0.0f, 1.5f, -3.25f}) {
    std::vector<float> y(x.size());
    ExpShifted(x.data(), shift, y.data(), static_cast<int64_t>(x.size()), GetParam());
    int bad = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float arg = x[i] - shift;  // the rounding the caller asked for
      if (arg > 88.0f) continue;
      const double want = std::exp(static_cast<double>(arg));
      const bool ok = arg < -87.0f ? y[i] == 0.0f || std::abs(y[i] - want) <= 2.4e-7 * want
                                   : std::abs(y[i] - want) <= 2.4e-7 * want;
      if (!ok && ++bad <= 5) {
        ADD_FAILURE() << "exp(" << x[i] << " - " << shift << ") = " << y[i] << ", want " << want;
      }
    }
    EXPECT_EQ(bad, 0) << "shift " << shift;
  }
}

TEST_P(PointwiseKernelsTest, ExpShiftedInPlace) {
  std::vector<float> x = {-90.0f, -5.0f, -0.5f, 0.0f, 0.25f, 3.0f, 40.0f, 1.0f, -1.0f};
  std::vector<float> want(x.size());
  ExpShifted(x.data(), 1.0f, want.data(), static_cast<int64_t>(x.size()), GetParam());
  ExpShifted(x.data(), 1.0f, x.data(), static_cast<int64_t>(x.size()), GetParam());
  EXPECT_EQ(x, want);
}

INSTANTIATE_TEST_SUITE_P(Levels, PointwiseKernelsTest, ::testing::ValuesIn(kAllSimdLevels),
                         [](const auto& info) { return std::string(SimdLevelName(info.param)); });

}  // namespace
}  // namespace zo::backend::cpu_internal
