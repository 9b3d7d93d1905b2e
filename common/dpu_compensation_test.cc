#include "common/dpu_compensation.h"

#include <cmath>
#include <optional>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

// AdamW in double over a few elements: the reference the coefficients are
// checked against.
struct AdamW {
  CompensationHyperParams hp;
  std::vector<double> w, m, v;
  int64_t count = 0;

  void Step(const std::vector<double>& g, double lr) {
    ++count;
    const double c1 = 1 - std::pow(hp.beta1, count), c2 = 1 - std::pow(hp.beta2, count);
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] *= 1 - lr * hp.weight_decay;
      m[i] = hp.beta1 * m[i] + (1 - hp.beta1) * g[i];
      v[i] = hp.beta2 * v[i] + (1 - hp.beta2) * g[i] * g[i];
      w[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + hp.eps);
    }
  }
  // The step's update with `g` but v as it is now (not updated by g).
  std::vector<double> StepWithOldV(const std::vector<double>& g, double lr) const {
    const double c1 = 1 - std::pow(hp.beta1, count + 1), c2 = 1 - std::pow(hp.beta2, count + 1);
    std::vector<double> out(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      const double m_next = hp.beta1 * m[i] + (1 - hp.beta1) * g[i];
      out[i] =
          w[i] * (1 - lr * hp.weight_decay) - lr * (m_next / c1) / (std::sqrt(v[i] / c2) + hp.eps);
    }
    return out;
  }
};

CompensatedStep Decided(double multiplier, double lr, int64_t applied_before,
                        std::optional<double> previous_lr = std::nullopt, bool skipped = false) {
  CompensatedStep s;
  s.skipped = skipped;
  s.grad_multiplier = multiplier;
  s.lr = lr;
  s.applied_before = applied_before;
  s.previous_lr = previous_lr;
  return s;
}

CompensationHyperParams Hp(double beta1, double beta2, double eps, double weight_decay) {
  CompensationHyperParams hp;
  hp.beta1 = beta1;
  hp.beta2 = beta2;
  hp.eps = eps;
  hp.weight_decay = weight_decay;
  return hp;
}

AdamW Trained(CompensationHyperParams hp, int steps, std::vector<double>* before_last,
              double* last_lr) {
  AdamW a{hp, {0.3}, {0.0}, {0.0}};
  for (int s = 1; s <= steps; ++s) {
    if (s == steps) *before_last = a.w;
    const double lr = 1e-2 * s / steps;
    a.Step({std::sin(1.7 * s) + 0.4}, lr);
    *last_lr = lr;
  }
  return a;
}

TEST(DpuCompensationTest, OneElementIsTheNextStepWithItsOldV) {
  // eps 0: the momentum part taken from the last update is then exact.
  const CompensationHyperParams hp = Hp(0.9, 0.99, 0, 0.1);
  std::vector<double> w_before;
  double previous_lr = 0;
  const AdamW a = Trained(hp, 7, &w_before, &previous_lr);
  const double raw_grad = 3072.0, multiplier = 1.0 / 4096.0, lr = 1.3e-2;
  const std::vector<double> want = a.StepWithOldV({raw_grad * multiplier}, lr);

  const CompensationTerms t =
      TermsFor(hp, Decided(multiplier, lr, a.count, previous_lr), 4, 1, a.v[0]);
  ZO_ASSERT_OK_AND_ASSIGN(const WeightsCompensation c, CombineTerms({&t, 1}, true));
  const double got = c.last * a.w[0] + c.before * w_before[0] - c.grad * raw_grad;
  EXPECT_NEAR(got, want[0], 1e-13);
  EXPECT_NE(got, a.w[0]);  // it moved
}

TEST(DpuCompensationTest, PartsOfServersShareOneGainFromTheTensorsMeanV) {
  const CompensationHyperParams hp = Hp(0.8, 0.999, 1e-8, 0);
  const CompensatedStep step = Decided(0.5, 1e-3, 3);
  const CompensationTerms parts[] = {TermsFor(hp, step, 2, 10, 10 * 4e-4),
                                     TermsFor(hp, step, 2, 30, 30 * 1e-4)};
  ZO_ASSERT_OK_AND_ASSIGN(const WeightsCompensation c, CombineTerms(parts, true));
  const double mean_v = (10 * 4e-4 + 30 * 1e-4) / 40;
  const double c1 = 1 - std::pow(0.8, 4), c2 = 1 - std::pow(0.999, 4);
  EXPECT_NEAR(c.grad, 0.5 * 1e-3 * 0.2 / c1 / (std::sqrt(mean_v / c2) + 1e-8), 1e-15);
  // No step before known: no momentum part, only the decay (none here).
  EXPECT_EQ(c.last, 1.0);
  EXPECT_EQ(c.before, 0.0);
}

TEST(DpuCompensationTest, SkippedStepLeavesTheServedWeights) {
  const CompensationTerms t =
      TermsFor(Hp(0.9, 0.999, 1e-8, 0.1), Decided(1, 1e-3, 9, 1e-3, /*skipped=*/true), 0, 5, 1.0);
  ZO_ASSERT_OK_AND_ASSIGN(const WeightsCompensation c, CombineTerms({&t, 1}, true));
  EXPECT_EQ(c.last, 1.0);
  EXPECT_EQ(c.before, 0.0);
  EXPECT_EQ(c.grad, 0.0);
}

TEST(DpuCompensationTest, WithoutTheVersionBeforeOnlyTheDecayAndGradient) {
  const CompensationTerms t =
      TermsFor(Hp(0.9, 0.999, 1e-8, 0.1), Decided(1, 1e-2, 9, 1e-2), 0, 5, 1.0);
  EXPECT_GT(t.momentum, 0.0);
  ZO_ASSERT_OK_AND_ASSIGN(const WeightsCompensation c, CombineTerms({&t, 1}, false));
  EXPECT_DOUBLE_EQ(c.last, 1 - 1e-2 * 0.1);
  EXPECT_EQ(c.before, 0.0);
  EXPECT_GT(c.grad, 0.0);
}

TEST(DpuCompensationTest, NoVYetNoGradientPart) {
  const CompensationTerms t = TermsFor({}, Decided(1, 1e-3, 0), 1, 8, 0.0);
  ZO_ASSERT_OK_AND_ASSIGN(const WeightsCompensation c, CombineTerms({&t, 1}, true));
  EXPECT_EQ(c.grad, 0.0);
  EXPECT_EQ(c.before, 0.0);  // no step before: n is 0
}

TEST(DpuCompensationTest, DisagreeingPartsAreRefused) {
  const CompensatedStep step = Decided(1, 1e-3, 2);
  CompensatedStep other = step;
  other.grad_multiplier = 0.5;
  const CompensationTerms parts[] = {TermsFor({}, step, 1, 8, 1.0), TermsFor({}, other, 1, 8, 1.0)};
  EXPECT_EQ(CombineTerms(parts, true).status().code(), absl::StatusCode::kInvalidArgument);
  const CompensationTerms tensors[] = {TermsFor({}, step, 1, 8, 1.0),
                                       TermsFor({}, step, 2, 8, 1.0)};
  EXPECT_EQ(CombineTerms(tensors, true).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CombineTerms({}, true).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zo
