// AdagradUpdate and LionUpdate on every kernel path against independent
// double-precision implementations of torch.optim.Adagrad (lr_decay 0, initial
// accumulator 0) and lion-pytorch, plus path-vs-scalar agreement.
//
// As in adam_kernels_test.cc, the asserted bound is a running first-order
// bound on fp32 rounding tracked along the reference trajectory: every fp32
// operation of the kernel is charged 2u = 2^-23 of its result and errors
// propagate as the formulas say. Lion's sign is ambiguous only where the
// reference's |beta1*m + (1-beta1)*g| is within that bound of 0; such elements
// (about 1.5% after 1000 steps, all with random-sign gradients: fixed-sign
// ones keep m's sign and must never be ambiguous) leave the comparison from
// that step on, and sign(0) = 0 is exercised by elements that never get a
// gradient.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/cpu_features.h"
#include "gtest/gtest.h"
#include "offload/optimizer_kernels.h"
#include "offload/optimizer_kernels_test_util.h"

namespace zo {
namespace {

using kernel_testing::AllKernelPaths;
using kernel_testing::GradBuffer;
using kernel_testing::GuardedBuffer;
using kernel_testing::KernelPath;
using kernel_testing::kUnitRoundoff;
using kernel_testing::RunAdagrad;
using kernel_testing::RunLion;
using kernel_testing::Unsupported;

constexpr double kE = 2 * kUnitRoundoff;  // charged per fp32 operation
constexpr DType kGradTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
constexpr size_t kLengths[] = {1, 15, 17, 1023, 4099};
constexpr int64_t kCheckSteps[] = {1, 10, 1000};

bool IsCheckStep(int64_t step) {
  return std::find(std::begin(kCheckSteps), std::end(kCheckSteps), step) != std::end(kCheckSteps);
}

double GradScale(int64_t step) { return (step % 3 == 0 ? 0.5 : 1.0) / 1024; }

// Gradient classes by element: 0 never any gradient, 1 always positive,
// 2 always negative, 3 random sign; magnitudes log-uniform in [1e-4, 1e-1].
class GradSource {
 public:
  GradSource(size_t n, uint32_t seed) : rng_(seed), magnitude_(n) {
    std::uniform_real_distribution<double> log_mag(std::log(1e-4), std::log(1e-1));
    for (double& m : magnitude_) m = std::exp(log_mag(rng_));
  }
  static int Class(size_t i) { return i % 29 == 3 ? 0 : static_cast<int>(i % 3) + 1; }

  // Loss-scaled gradients of `step` stored in `grad`; returns the decoded values.
  std::vector<double> Fill(int64_t step, GradBuffer& grad) {
    std::uniform_real_distribution<double> unit(0.2, 1.0);
    std::vector<double> raw(magnitude_.size());
    for (size_t i = 0; i < raw.size(); ++i) {
      double g = magnitude_[i] * unit(rng_) / GradScale(step);
      if (Class(i) == 0) g = 0;
      if (Class(i) == 2 || (Class(i) == 3 && rng_() % 2 == 0)) g = -g;
      raw[i] = grad.Set(i, static_cast<float>(g));
    }
    return raw;
  }

 private:
  std::mt19937 rng_;
  std::vector<double> magnitude_;
};

std::vector<float> RandomParams(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> p(n);
  for (float& x : p) x = unit(rng);
  return p;
}

// Worst |got - want| / bound over the elements where `use` is set.
double WorstRatio(const float* got, const std::vector<double>& want,
                  const std::vector<double>& bound, const std::vector<bool>& use, size_t* where) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!use[i]) continue;
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double ratio = err == 0 ? 0.0 : err / (bound[i] + 1e-300);
    if (!(ratio <= worst)) worst = ratio, *where = i;
  }
  return worst;
}

class AdagradLionKernelTest : public ::testing::TestWithParam<KernelPath> {
 protected:
  void SetUp() override {
    if (std::string why = Unsupported(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
};

// ---- Adagrad ----

struct AdagradRef {
  explicit AdagradRef(const std::vector<float>& p0)
      : p(p0.begin(), p0.end()), sum(p0.size()), ep(p0.size()), es(p0.size()) {}
  std::vector<double> p, sum, ep, es;
};

// torch.optim.Adagrad, lr_decay = 0, in double:
//   grad += weight_decay * param   (if weight_decay != 0)
//   state_sum += grad * grad;  param -= lr * grad / (sqrt(state_sum) + eps)
void ReferenceAdagradStep(const AdagradHyperParams& hp, double grad_scale,
                          const std::vector<double>& raw, AdagradRef& r,
                          bool eps_inside_sqrt = false) {
  for (size_t i = 0; i < raw.size(); ++i) {
    const double scaled = raw[i] * grad_scale;
    const double p0 = r.p[i], s0 = r.sum[i];
    const double g = scaled + hp.weight_decay * p0;
    const double s1 = s0 + g * g;
    const double denom = eps_inside_sqrt ? std::sqrt(s1 + hp.eps) : std::sqrt(s1) + hp.eps;
    const double update = hp.lr * g / denom;
    r.p[i] = p0 - update;
    r.sum[i] = s1;

    // Rounding-error bound of the fp32 kernel for this step, first order.
    const double eg =
        kE * (2 * std::fabs(scaled) + 3 * std::fabs(hp.weight_decay * p0) + std::fabs(g)) +
        hp.weight_decay * r.ep[i];
    r.es[i] += 2 * std::fabs(g) * eg + kE * (g * g + s1);
    const double rel_s = s1 > 0 ? r.es[i] / s1 : 0.0;
    const double ed = std::sqrt(s1) * (0.5 * rel_s + kE) + kE * hp.eps + kE * denom;
    const double eu = hp.lr * eg / denom + std::fabs(update) * (3 * kE + ed / denom);
    r.ep[i] += eu + kE * std::fabs(r.p[i]);
  }
}

const AdagradHyperParams kAdagradCases[] = {{1e-2, 1e-10, 0.0}, {5e-2, 1e-3, 0.05}};

TEST_P(AdagradLionKernelTest, AdagradMatchesDoubleReference) {
  for (const AdagradHyperParams& hp : kAdagradCases) {
    for (DType grad_type : kGradTypes) {
      for (size_t n : kLengths) {
        SCOPED_TRACE(::testing::Message()
                     << "wd=" << hp.weight_decay << " grad=" << DTypeName(grad_type) << " n=" << n);
        GradSource source(n, static_cast<uint32_t>(n + 3 * static_cast<int>(grad_type)));
        const std::vector<float> p0 = RandomParams(n, 17);
        GuardedBuffer<float> p(n, 1), sum(n, 2);
        GuardedBuffer<uint16_t> copy(n, 1);
        std::copy(p0.begin(), p0.end(), p.data());
        std::fill(sum.data(), sum.data() + n, 0.0f);
        GradBuffer grad(grad_type, n, 1);
        const DType copy_type = grad_type == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
        AdagradRef ref(p0);
        const std::vector<bool> all(n, true);
        for (int64_t step = 1; step <= 1000; ++step) {
          const std::vector<double> raw = source.Fill(step, grad);
          RunAdagrad(GetParam(), MakeAdagradStepConstants(hp, GradScale(step)), grad.ptr(),
                     p.data(), sum.data(), {copy.data(), copy_type}, n);
          ReferenceAdagradStep(hp, GradScale(step), raw, ref);
          for (size_t i = 0; i < n; ++i) {
            ASSERT_EQ(copy[i], kernel_testing::LowBits(copy_type, p[i])) << i << " step " << step;
          }
          if (!IsCheckStep(step)) continue;
          size_t ip = 0, is = 0;
          EXPECT_LE(WorstRatio(p.data(), ref.p, ref.ep, all, &ip), 1.0)
              << "p[" << ip << "] step " << step << ": " << p[ip] << " vs " << ref.p[ip];
          EXPECT_LE(WorstRatio(sum.data(), ref.sum, ref.es, all, &is), 1.0)
              << "sum[" << is << "] step " << step << ": " << sum[is] << " vs " << ref.sum[is];
          if (step == 10 && n == 1023) {  // the bound would catch eps inside the sqrt
            AdagradRef wrong(p0);
            GradSource again(n, static_cast<uint32_t>(n + 3 * static_cast<int>(grad_type)));
            GradBuffer scratch(grad_type, n, 0);
            for (int64_t t = 1; t <= 10; ++t) {
              ReferenceAdagradStep(hp, GradScale(t), again.Fill(t, scratch), wrong, true);
            }
            EXPECT_GT(WorstRatio(p.data(), wrong.p, ref.ep, all, &ip), 10.0);
          }
        }
        EXPECT_TRUE(p.GuardsIntact() && sum.GuardsIntact() && copy.GuardsIntact());
      }
    }
  }
}

// ---- Lion ----

struct LionRef {
  explicit LionRef(const std::vector<float>& p0)
      : p(p0.begin(), p0.end()), m(p0.size()), ep(p0.size()), em(p0.size()), use(p0.size(), true) {}
  std::vector<double> p, m, ep, em;
  std::vector<bool> use;  // false once the sign was ambiguous in fp32
};

double Sign(double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0; }

// lion-pytorch, in double:
//   param *= 1 - lr * weight_decay
//   param -= lr * sign(beta1 * exp_avg + (1 - beta1) * grad)
//   exp_avg = beta2 * exp_avg + (1 - beta2) * grad
// `m_first` is a deliberate bug for the bound check: exp_avg updated first.
void ReferenceLionStep(const LionHyperParams& hp, double grad_scale, const std::vector<double>& raw,
                       LionRef& r, bool m_first = false) {
  const double decay = 1 - hp.lr * hp.weight_decay;
  for (size_t i = 0; i < raw.size(); ++i) {
    const double g = raw[i] * grad_scale;
    const double m0 = r.m[i];
    const double m1 = hp.beta2 * m0 + (1 - hp.beta2) * g;
    const double c = hp.beta1 * (m_first ? m1 : m0) + (1 - hp.beta1) * g;
    r.p[i] = r.p[i] * decay - hp.lr * Sign(c);
    r.m[i] = m1;

    // Rounding-error bound, first order; the sign is exact unless |c| is
    // within the error of the fp32 c. The kernel weighs g by 1 - fp32(beta),
    // whose error is that of fp32(beta): u * beta absolute, not relative.
    const double eg = 2 * kE * std::fabs(g);
    const double ec = hp.beta1 * r.em[i] + (1 - hp.beta1) * eg +
                      3 * kE * (hp.beta1 * std::fabs(m0) + (1 - hp.beta1) * std::fabs(g)) +
                      kE * hp.beta1 * std::fabs(g);
    if (std::fabs(c) <= ec && ec > 0) r.use[i] = false;
    r.em[i] = hp.beta2 * r.em[i] + (1 - hp.beta2) * eg +
              3 * kE * (hp.beta2 * std::fabs(m0) + (1 - hp.beta2) * std::fabs(g)) +
              kE * hp.beta2 * std::fabs(g);
    r.ep[i] =
        r.ep[i] * decay + 2 * kE * std::fabs(r.p[i] * decay) + kE * std::fabs(r.p[i]) + kE * hp.lr;
  }
}

const LionHyperParams kLionCases[] = {{1e-4, 0.9, 0.99, 0.0}, {3e-3, 0.95, 0.98, 0.1}};

TEST_P(AdagradLionKernelTest, LionMatchesDoubleReference) {
  for (const LionHyperParams& hp : kLionCases) {
    for (DType grad_type : kGradTypes) {
      for (size_t n : kLengths) {
        SCOPED_TRACE(::testing::Message()
                     << "wd=" << hp.weight_decay << " grad=" << DTypeName(grad_type) << " n=" << n);
        GradSource source(n, static_cast<uint32_t>(2 * n + static_cast<int>(grad_type)));
        const std::vector<float> p0 = RandomParams(n, 23);
        GuardedBuffer<float> p(n, 3), m(n, 1);
        GuardedBuffer<uint16_t> copy(n, 1);
        std::copy(p0.begin(), p0.end(), p.data());
        std::fill(m.data(), m.data() + n, 0.0f);
        GradBuffer grad(grad_type, n, 1);
        const DType copy_type = grad_type == DType::kBFloat16 ? DType::kFloat16 : DType::kBFloat16;
        LionRef ref(p0), wrong(p0);
        for (int64_t step = 1; step <= 1000; ++step) {
          const std::vector<double> raw = source.Fill(step, grad);
          RunLion(GetParam(), MakeLionStepConstants(hp, GradScale(step)), grad.ptr(), p.data(),
                  m.data(), {copy.data(), copy_type}, n);
          ReferenceLionStep(hp, GradScale(step), raw, ref);
          if (step <= 10) ReferenceLionStep(hp, GradScale(step), raw, wrong, true);
          for (size_t i = 0; i < n; ++i) {
            ASSERT_EQ(copy[i], kernel_testing::LowBits(copy_type, p[i])) << i << " step " << step;
          }
          if (!IsCheckStep(step)) continue;
          size_t ip = 0, im = 0;
          const std::vector<bool> all(n, true);
          EXPECT_LE(WorstRatio(p.data(), ref.p, ref.ep, ref.use, &ip), 1.0)
              << "p[" << ip << "] step " << step << ": " << p[ip] << " vs " << ref.p[ip];
          EXPECT_LE(WorstRatio(m.data(), ref.m, ref.em, all, &im), 1.0)
              << "m[" << im << "] step " << step << ": " << m[im] << " vs " << ref.m[im];
          if (step == 10 && n >= 1023) {
            EXPECT_GT(WorstRatio(p.data(), wrong.p, ref.ep, ref.use, &ip), 10.0);
          }
        }
        size_t ambiguous = 0;
        for (size_t i = 0; i < n; ++i) {
          if (ref.use[i]) continue;
          ++ambiguous;
          EXPECT_EQ(GradSource::Class(i), 3) << "fixed-sign element " << i << " went ambiguous";
        }
        EXPECT_LE(ambiguous, n / 20 + 1);  // measured: about 1.5%
        for (size_t i = 0; i < n; ++i) {   // sign(0) = 0: only the decay moved these
          if (GradSource::Class(i) == 0) {
            ASSERT_EQ(m[i], 0.0f) << i;
          }
        }
        EXPECT_TRUE(p.GuardsIntact() && m.GuardsIntact() && copy.GuardsIntact());
      }
    }
  }
}

// One step from the same random state. Adagrad: sum within 8u of its two
// terms, p within 4u of |p| plus 16u of lr * |g| / denom. Lion: m within 8u
// of its terms and p bit-identical wherever the sign is unambiguous (the only
// contracted operation is inside the sign's argument).
TEST_P(AdagradLionKernelTest, AgreesWithScalarPath) {
  constexpr size_t n = 4099;
  const double u = kUnitRoundoff;
  for (DType grad_type : kGradTypes) {
    SCOPED_TRACE(DTypeName(grad_type));
    std::mt19937 rng(9);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f), pos(0.0f, 1e-3f);
    std::vector<float> p(n), s(n), m(n);
    GradBuffer grad(grad_type, n, 1);
    for (size_t i = 0; i < n; ++i) {
      p[i] = unit(rng);
      s[i] = pos(rng);
      m[i] = 0.01f * unit(rng);
      grad.Set(i, 1024.0f * 0.01f * unit(rng));
    }
    const AdagradStepConstants ac = MakeAdagradStepConstants(kAdagradCases[1], 1.0 / 1024);
    std::vector<float> ps(p), ss(s), pk(p), sk(s);
    AdagradUpdate(ac, grad.ptr(), ps.data(), ss.data(), TypedPtr{}, n, SimdLevel::kScalar);
    RunAdagrad(GetParam(), ac, grad.ptr(), pk.data(), sk.data(), TypedPtr{}, n);
    for (size_t i = 0; i < n; ++i) {
      const double g = std::fabs(grad.Get(i) * ac.grad_scale) + ac.weight_decay * std::fabs(p[i]);
      ASSERT_LE(std::fabs(sk[i] - ss[i]), 8 * u * (s[i] + g * g)) << "sum[" << i << "]";
      const double denom = std::sqrt(ss[i]) + ac.eps;
      ASSERT_LE(std::fabs(pk[i] - ps[i]), 4 * u * std::fabs(ps[i]) + 16 * u * ac.lr * g / denom)
          << "p[" << i << "]";
    }
    const LionStepConstants lc = MakeLionStepConstants(kLionCases[1], 1.0 / 1024);
    std::vector<float> lps(p), lms(m), lpk(p), lmk(m);
    LionUpdate(lc, grad.ptr(), lps.data(), lms.data(), TypedPtr{}, n, SimdLevel::kScalar);
    RunLion(GetParam(), lc, grad.ptr(), lpk.data(), lmk.data(), TypedPtr{}, n);
    for (size_t i = 0; i < n; ++i) {
      const double g = std::fabs(grad.Get(i) * lc.grad_scale);
      const double c = lc.beta1 * m[i] + (1 - lc.beta1) * grad.Get(i) * lc.grad_scale;
      const double terms = lc.beta1 * std::fabs(m[i]) + (1 - lc.beta1) * g;
      ASSERT_LE(std::fabs(lmk[i] - lms[i]),
                8 * u * (lc.beta2 * std::fabs(m[i]) + (1 - lc.beta2) * g))
          << "m[" << i << "]";
      if (std::fabs(c) > 8 * u * terms) {
        ASSERT_TRUE(kernel_testing::SameBits(lpk[i], lps[i])) << "p[" << i << "]";
      }
    }
  }
}

// torch.sign semantics on every path: sign(+-0) = 0, sign(NaN) = NaN.
TEST_P(AdagradLionKernelTest, LionSignOfZeroAndNaN) {
  constexpr size_t n = 37;  // a full vector of each width plus a tail
  std::vector<float> p(n, 0.5f), m(n, 0.0f), g(n, 0.0f);
  for (size_t i = 0; i < n; i += 3) g[i] = -0.0f;
  g[20] = NAN;
  g[36] = NAN;
  const LionStepConstants c = MakeLionStepConstants({0.25, 0.9, 0.99, 0.0}, 1.0);
  RunLion(GetParam(), c, {g.data(), DType::kFloat32}, p.data(), m.data(), TypedPtr{}, n);
  for (size_t i = 0; i < n; ++i) {
    if (i == 20 || i == 36) {
      EXPECT_TRUE(std::isnan(p[i])) << i;
    } else {
      EXPECT_EQ(p[i], 0.5f) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, AdagradLionKernelTest, ::testing::ValuesIn(AllKernelPaths()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace zo
