// AdamUpdate on every kernel path against an independent double-precision
// implementation of torch.optim.Adam / AdamW, plus path-vs-scalar agreement
// and the low-precision copy.
//
// The bound asserted against the double reference is a running first-order
// bound on fp32 rounding, tracked per element along the reference trajectory:
// each fp32 operation the kernel performs (constants rounded to fp32
// included) is charged 2u = 2^-23 relative to its result, twice the unit
// roundoff, and errors propagate through m, v, denom and p exactly as the
// formulas do (m and v errors decay with beta1 / beta2, p errors add up over
// the steps). So a failure means an error beyond what fp32 arithmetic can
// explain. The WrongFormulasExceedTheBound test shows the bound is tight: a
// reference with eps inside the sqrt, without bias correction, with AdamW's
// decay after the update, or with Adam / AdamW swapped misses the kernels by
// more than 10x the bound.
#include <algorithm>
#include <bit>
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
using kernel_testing::RunAdam;
using kernel_testing::Unsupported;

constexpr double kE = 2 * kUnitRoundoff;  // charged per fp32 operation

enum class Mutation { kNone, kEpsInsideSqrt, kNoBiasCorrection, kDecayAfterUpdate, kSwapAdamW };

struct AdamCase {
  const char* name;
  AdamHyperParams hp;
};

// Adam vs AdamW, weight decay on / off, bias correction on / off; the last
// case has an eps large enough next to sqrt(v) that where it goes matters.
const AdamCase kCases[] = {
    {"adamw", {1e-2, 0.9, 0.999, 1e-8, 0.1, true, true}},
    {"adam_l2", {1e-2, 0.9, 0.999, 1e-8, 0.05, false, true}},
    {"adam_no_decay_no_bias", {1e-3, 0.9, 0.99, 1e-6, 0.0, false, false}},
    {"adamw_no_bias_large_eps", {3e-2, 0.8, 0.95, 1e-3, 0.3, true, false}},
};

// Double state of the reference plus the running error bounds of an fp32
// kernel following it (see the file comment).
struct Reference {
  explicit Reference(const std::vector<float>& p0)
      : p(p0.begin(), p0.end()),
        m(p0.size()),
        v(p0.size()),
        ep(p0.size()),
        em(p0.size()),
        ev(p0.size()) {}
  std::vector<double> p, m, v;
  std::vector<double> ep, em, ev;
};

// One step of torch.optim.Adam / AdamW (single-tensor path), in double:
//   Adam:  grad += weight_decay * param              (if weight_decay != 0)
//   AdamW: param *= 1 - lr * weight_decay
//   exp_avg = exp_avg.lerp(grad, 1 - beta1)
//   exp_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * grad * grad
//   denom = sqrt(exp_avg_sq) / sqrt(1 - beta2^step) + eps
//   param -= lr / (1 - beta1^step) * exp_avg / denom
// `raw` holds the decoded gradient as stored; torch sees raw * grad_scale.
void ReferenceAdamStep(const AdamHyperParams& hp, int64_t step, double grad_scale,
                       const std::vector<double>& raw, Reference& r,
                       Mutation mutation = Mutation::kNone) {
  const bool adam_w = hp.adam_w_mode != (mutation == Mutation::kSwapAdamW);
  const bool bias = hp.bias_correction && mutation != Mutation::kNoBiasCorrection;
  const double bc1 = bias ? 1 - std::pow(hp.beta1, static_cast<double>(step)) : 1.0;
  const double bc2 = bias ? 1 - std::pow(hp.beta2, static_cast<double>(step)) : 1.0;
  const double step_size = hp.lr / bc1;
  const double decay = adam_w ? 1 - hp.lr * hp.weight_decay : 1.0;
  const double l2 = adam_w ? 0.0 : hp.weight_decay;
  for (size_t i = 0; i < raw.size(); ++i) {
    const double scaled = raw[i] * grad_scale;
    const double p0 = r.p[i], m0 = r.m[i], v0 = r.v[i];
    const double g = scaled + l2 * p0;
    double param = mutation == Mutation::kDecayAfterUpdate ? p0 : p0 * decay;
    const double m1 = m0 + (g - m0) * (1 - hp.beta1);
    const double v1 = v0 * hp.beta2 + (1 - hp.beta2) * g * g;
    const double denom = mutation == Mutation::kEpsInsideSqrt
                             ? std::sqrt(v1 / bc2 + hp.eps)
                             : std::sqrt(v1) / std::sqrt(bc2) + hp.eps;
    const double update = step_size * m1 / denom;
    param -= update;
    if (mutation == Mutation::kDecayAfterUpdate) param *= decay;
    r.p[i] = param;
    r.m[i] = m1;
    r.v[i] = v1;

    // Rounding-error bound of the fp32 kernel for this step, first order.
    const double c = 1 / std::sqrt(bc2);
    const double eg =
        kE * (2 * std::fabs(scaled) + 3 * std::fabs(l2 * p0) + std::fabs(g)) + l2 * r.ep[i];
    const double e_param = r.ep[i] * decay + 2 * kE * std::fabs(p0 * decay);
    r.em[i] = hp.beta1 * r.em[i] + (1 - hp.beta1) * eg +
              3 * kE * (hp.beta1 * std::fabs(m0) + (1 - hp.beta1) * std::fabs(g));
    r.ev[i] = hp.beta2 * r.ev[i] + (1 - hp.beta2) * 2 * std::fabs(g) * eg +
              4 * kE * (hp.beta2 * v0 + (1 - hp.beta2) * g * g);
    const double sqrt_v = std::sqrt(v1);
    const double rel_v = v1 > 0 ? r.ev[i] / v1 : 0.0;
    const double ed = sqrt_v * c * (0.5 * rel_v + 3 * kE) + kE * hp.eps + kE * denom;
    const double eu = std::fabs(update) * (3 * kE + ed / denom) + step_size * r.em[i] / denom;
    r.ep[i] = e_param + eu + kE * std::fabs(param);
  }
}

// Seeded per call site so failures reproduce.
struct Problem {
  Problem(size_t n, uint32_t seed) : rng(seed), p0(n), magnitude(n) {
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    std::uniform_real_distribution<double> log_mag(std::log(1e-4), std::log(1e-1));
    for (size_t i = 0; i < n; ++i) {
      p0[i] = unit(rng);
      // Every 37th element gets no gradient at all (m, v stay 0).
      magnitude[i] = i % 37 == 5 ? 0.0 : std::exp(log_mag(rng));
    }
  }

  // The step's scale, clip_coef / loss_scale, changing from step to step.
  static double GradScale(int64_t step) {
    const double loss_scale[] = {256.0, 1024.0, 4096.0};
    const double clip = (step / 7) % 2 == 0 ? 1.0 : 0.6;
    return clip / loss_scale[step % 3];
  }

  // Fills `grad` with loss-scaled gradients for `step`; returns the decoded
  // values the kernel will read.
  std::vector<double> FillGradient(int64_t step, GradBuffer& grad) {
    std::normal_distribution<double> normal;
    std::vector<double> raw(p0.size());
    for (size_t i = 0; i < p0.size(); ++i) {
      const double g = magnitude[i] * normal(rng) / GradScale(step);
      raw[i] = grad.Set(i, static_cast<float>(g));
    }
    return raw;
  }

  std::mt19937 rng;
  std::vector<float> p0;
  std::vector<double> magnitude;
};

// Worst |got - want| / bound over the elements, with the index where it is.
struct Worst {
  double ratio = 0;
  size_t index = 0;
};

Worst WorstRatio(const float* got, const std::vector<double>& want,
                 const std::vector<double>& bound) {
  Worst w;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double ratio = err == 0 ? 0.0 : err / (bound[i] + 1e-300);
    if (!(ratio <= w.ratio)) w = {ratio, i};  // NaN counts as worst
  }
  return w;
}

class AdamKernelTest : public ::testing::TestWithParam<KernelPath> {
 protected:
  void SetUp() override {
    if (std::string why = Unsupported(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
};

constexpr DType kGradTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
constexpr size_t kLengths[] = {1, 15, 17, 1023, 4099};

// Runs 1000 steps, checking p, m, v against the reference after steps 1, 10
// and 1000 and the copy (bit for bit) after every step.
void RunAgainstReference(const KernelPath& path, const AdamCase& ac, DType grad_type, int copy_kind,
                         size_t n) {
  SCOPED_TRACE(::testing::Message() << ac.name << " grad=" << DTypeName(grad_type)
                                    << " copy_kind=" << copy_kind << " n=" << n);
  Problem prob(n, static_cast<uint32_t>(n * 31 + static_cast<int>(grad_type) * 7 + copy_kind));
  GuardedBuffer<float> p(n, 1), m(n, 2), v(n, 3), copy32(n, 5);
  GuardedBuffer<uint16_t> copy16(n, 3);
  std::copy(prob.p0.begin(), prob.p0.end(), p.data());
  std::fill(m.data(), m.data() + n, 0.0f);
  std::fill(v.data(), v.data() + n, 0.0f);
  GradBuffer grad(grad_type, n, 1);
  // copy_kind: 0 none, 1 fp16, 2 bf16, 3 fp32.
  const TypedPtr copy = copy_kind == 0   ? TypedPtr{}
                        : copy_kind == 1 ? TypedPtr{copy16.data(), DType::kFloat16}
                        : copy_kind == 2 ? TypedPtr{copy16.data(), DType::kBFloat16}
                                         : TypedPtr{copy32.data(), DType::kFloat32};
  Reference ref(prob.p0);
  for (int64_t step = 1; step <= 1000; ++step) {
    const std::vector<double> raw = prob.FillGradient(step, grad);
    const double scale = Problem::GradScale(step);
    RunAdam(path, MakeAdamStepConstants(ac.hp, step, scale), grad.ptr(), p.data(), m.data(),
            v.data(), copy, n);
    ReferenceAdamStep(ac.hp, step, scale, raw, ref);
    for (size_t i = 0; i < n && copy_kind != 0; ++i) {
      const bool ok = copy_kind == 3 ? kernel_testing::SameBits(copy32[i], p[i])
                                     : copy16[i] == kernel_testing::LowBits(copy.dtype, p[i]);
      ASSERT_TRUE(ok) << "copy of element " << i << " at step " << step;
    }
    if (step != 1 && step != 10 && step != 1000) continue;
    const Worst wp = WorstRatio(p.data(), ref.p, ref.ep);
    const Worst wm = WorstRatio(m.data(), ref.m, ref.em);
    const Worst wv = WorstRatio(v.data(), ref.v, ref.ev);
    EXPECT_LE(wp.ratio, 1.0) << "p[" << wp.index << "] step " << step << ": " << p[wp.index]
                             << " vs " << ref.p[wp.index] << " bound " << ref.ep[wp.index];
    EXPECT_LE(wm.ratio, 1.0) << "m[" << wm.index << "] step " << step << ": " << m[wm.index]
                             << " vs " << ref.m[wm.index] << " bound " << ref.em[wm.index];
    EXPECT_LE(wv.ratio, 1.0) << "v[" << wv.index << "] step " << step << ": " << v[wv.index]
                             << " vs " << ref.v[wv.index] << " bound " << ref.ev[wv.index];
  }
  EXPECT_TRUE(p.GuardsIntact() && m.GuardsIntact() && v.GuardsIntact());
  EXPECT_TRUE(copy16.GuardsIntact() && copy32.GuardsIntact());
}

TEST_P(AdamKernelTest, MatchesDoubleReferenceOverManySteps) {
  int variant = 0;
  for (const AdamCase& ac : kCases) {
    for (DType grad_type : kGradTypes) {
      const int copy_kind = variant++ % 4;  // every copy type meets every grad type
      for (size_t n : kLengths) {
        RunAgainstReference(GetParam(), ac, grad_type, copy_kind, n);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The bound is meaningful only if plausible bugs break it: each mutated
// reference must miss the kernel's result by more than 10x the bound
// somewhere, after 1 and after 10 steps.
TEST_P(AdamKernelTest, WrongFormulasExceedTheBound) {
  struct Probe {
    Mutation mutation;
    const AdamCase* ac;
  };
  const Probe probes[] = {
      {Mutation::kEpsInsideSqrt, &kCases[3]},    {Mutation::kEpsInsideSqrt, &kCases[0]},
      {Mutation::kNoBiasCorrection, &kCases[0]}, {Mutation::kNoBiasCorrection, &kCases[1]},
      {Mutation::kDecayAfterUpdate, &kCases[0]}, {Mutation::kDecayAfterUpdate, &kCases[3]},
      {Mutation::kSwapAdamW, &kCases[0]},        {Mutation::kSwapAdamW, &kCases[1]},
  };
  constexpr size_t n = 1023;
  for (const Probe& probe : probes) {
    SCOPED_TRACE(::testing::Message()
                 << probe.ac->name << " mutation " << static_cast<int>(probe.mutation));
    Problem prob(n, 77);
    std::vector<float> p(prob.p0), m(n, 0.0f), v(n, 0.0f);
    GradBuffer grad(DType::kFloat16, n, 0);
    Reference right(prob.p0), wrong(prob.p0);
    for (int64_t step = 1; step <= 10; ++step) {
      const std::vector<double> raw = prob.FillGradient(step, grad);
      const double scale = Problem::GradScale(step);
      RunAdam(GetParam(), MakeAdamStepConstants(probe.ac->hp, step, scale), grad.ptr(), p.data(),
              m.data(), v.data(), TypedPtr{}, n);
      ReferenceAdamStep(probe.ac->hp, step, scale, raw, right);
      ReferenceAdamStep(probe.ac->hp, step, scale, raw, wrong, probe.mutation);
      if (step == 1 || step == 10) {
        EXPECT_LE(WorstRatio(p.data(), right.p, right.ep).ratio, 1.0) << "step " << step;
        EXPECT_GT(WorstRatio(p.data(), wrong.p, right.ep).ratio, 10.0) << "step " << step;
      }
    }
  }
}

// One step from the same random state: every path agrees with the scalar
// reference within a few fp32 roundings of the operands (the paths differ
// only by FMA contraction): m and v within 8u of the magnitude of their two
// terms, p within 4u of |p| plus 16u of step_size * |m terms| / denom.
TEST_P(AdamKernelTest, AgreesWithScalarPath) {
  for (const AdamCase& ac : kCases) {
    for (DType grad_type : kGradTypes) {
      SCOPED_TRACE(::testing::Message() << ac.name << " grad=" << DTypeName(grad_type));
      constexpr size_t n = 4099;
      std::mt19937 rng(5);
      std::uniform_real_distribution<float> unit(-1.0f, 1.0f), pos(0.0f, 1e-4f);
      std::vector<float> p(n), m(n), v(n);
      GradBuffer grad(grad_type, n, 1);
      for (size_t i = 0; i < n; ++i) {
        p[i] = unit(rng);
        m[i] = 0.01f * unit(rng);
        v[i] = pos(rng);
        grad.Set(i, 2048.0f * 0.01f * unit(rng));
      }
      const AdamStepConstants c = MakeAdamStepConstants(ac.hp, 3, 1.0 / 2048);
      std::vector<float> ps(p), ms(m), vs(v), pk(p), mk(m), vk(v);
      AdamUpdate(c, grad.ptr(), ps.data(), ms.data(), vs.data(), TypedPtr{}, n, SimdLevel::kScalar);
      RunAdam(GetParam(), c, grad.ptr(), pk.data(), mk.data(), vk.data(), TypedPtr{}, n);
      const double u = kUnitRoundoff;
      for (size_t i = 0; i < n; ++i) {
        const double g = std::fabs(grad.Get(i) * c.grad_scale) + c.weight_decay * std::fabs(p[i]);
        const double m_terms = c.beta1 * std::fabs(m[i]) + c.one_minus_beta1 * g;
        const double v_terms = c.beta2 * v[i] + c.one_minus_beta2 * g * g;
        const double denom = std::sqrt(vs[i]) * c.inv_sqrt_bias2 + c.eps;
        ASSERT_LE(std::fabs(mk[i] - ms[i]), 8 * u * m_terms) << "m[" << i << "]";
        ASSERT_LE(std::fabs(vk[i] - vs[i]), 8 * u * v_terms) << "v[" << i << "]";
        ASSERT_LE(std::fabs(pk[i] - ps[i]),
                  4 * u * std::fabs(ps[i]) + 16 * u * c.step_size * m_terms / denom)
            << "p[" << i << "]";
      }
    }
  }
}

// Master values where rounding to fp16 / bf16 is hard (ties, one ulp off,
// fp32 subnormals that VCVTNEPS2BF16 would flush, fp16 overflow) stay fixed
// (zero gradient and moments, no decay); NaN and Inf gradients make NaN
// masters. The copy must equal the scalar conversion of the stored master.
TEST_P(AdamKernelTest, CopyIsRoundedStoredMaster) {
  constexpr size_t n = 4099;
  std::mt19937 rng(11);
  std::vector<float> p0(n);
  GradBuffer grad(DType::kFloat32, n, 0);
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits = static_cast<uint32_t>(rng());
    switch (i % 6) {
      case 0:
        bits = (bits & 0x80000000u) | 0x00000001u | (bits & 0x007FFFFFu);
        break;  // subnormal
      case 1:
        bits = (bits & 0xFFFF0000u) | 0x8000u;
        break;  // bf16 tie
      case 2:
        bits = (bits & 0xFFFFE000u) | 0x1000u;
        break;  // fp16 tie (if in range)
      case 3:
        bits = (bits & 0x8FFFFFFFu) | 0x47000000u;
        break;  // ~fp16 max and above
      default:
        break;  // any (NaN, Inf too)
    }
    p0[i] = std::bit_cast<float>(bits);
    const bool poison = i % 97 == 3;
    grad.Set(i, poison ? (i % 2 ? INFINITY : NAN) : 0.0f);
  }
  AdamHyperParams hp;  // Adam without decay: decay_factor is exactly 1
  hp.adam_w_mode = false;
  const AdamStepConstants c = MakeAdamStepConstants(hp, 1, 1.0);
  for (DType copy_type : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<float> p(p0), m(n, 0.0f), v(n, 0.0f);
    std::vector<uint16_t> copy(n);
    RunAdam(GetParam(), c, grad.ptr(), p.data(), m.data(), v.data(), {copy.data(), copy_type}, n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(copy[i], kernel_testing::LowBits(copy_type, p[i]))
          << DTypeName(copy_type) << " copy of element " << i << " = " << p[i];
      const bool poison = i % 97 == 3;
      if (poison) {
        EXPECT_TRUE(std::isnan(p[i])) << i;
      } else if (!std::isnan(p0[i])) {
        EXPECT_TRUE(kernel_testing::SameBits(p[i], p0[i])) << i;
      }
    }
  }
}

// Weights in [-3, 3), moments of a tenth and a hundredth of that scale (v
// positive) and gradients in [-3, 3), for the tests that compare two runs.
void FillRandomState(std::mt19937& rng, std::vector<float>& p, std::vector<float>& m,
                     std::vector<float>& v, GradBuffer& grad) {
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] = dist(rng);
    m[i] = dist(rng) * 0.1f;
    v[i] = std::abs(dist(rng)) * 0.01f;
    grad.Set(i, dist(rng));
  }
}

// CopyOf::kOldWeight (what a delayed parameter update checks its undo
// against): the copy is the master as it was before the step, rounded, and
// the step itself is bit for bit the one that writes the new weight's copy.
// Every length up to two vectors and a long odd one, so the masked or
// scratch tails are covered too.
TEST_P(AdamKernelTest, OldWeightCopyIsTheMasterBeforeTheStep) {
  AdamHyperParams hp;
  hp.weight_decay = 0.1;
  const AdamStepConstants c = MakeAdamStepConstants(hp, 3, 0.5);
  std::mt19937 rng(5);
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 33; ++n) lengths.push_back(n);
  lengths.push_back(1027);
  for (DType copy_type : {DType::kFloat16, DType::kBFloat16}) {
    for (size_t n : lengths) {
      std::vector<float> p0(n), m0(n), v0(n);
      GradBuffer grad(DType::kFloat16, n, 0);
      FillRandomState(rng, p0, m0, v0, grad);
      std::vector<float> p(p0), m(m0), v(v0), pn(p0), mn(m0), vn(v0);
      std::vector<uint16_t> old_copy(n + 1, 0xABCD), new_copy(n);
      RunAdam(GetParam(), c, grad.ptr(), p.data(), m.data(), v.data(), {old_copy.data(), copy_type},
              n, CopyOf::kOldWeight);
      RunAdam(GetParam(), c, grad.ptr(), pn.data(), mn.data(), vn.data(),
              {new_copy.data(), copy_type}, n);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(old_copy[i], kernel_testing::LowBits(copy_type, p0[i]))
            << DTypeName(copy_type) << " n=" << n << " element " << i;
        ASSERT_TRUE(kernel_testing::SameBits(p[i], pn[i])) << "n=" << n << " element " << i;
        ASSERT_TRUE(kernel_testing::SameBits(m[i], mn[i])) << "n=" << n << " element " << i;
        ASSERT_TRUE(kernel_testing::SameBits(v[i], vn[i])) << "n=" << n << " element " << i;
      }
      EXPECT_EQ(old_copy[n], 0xABCD) << "written past the end, n=" << n;
    }
  }
}

// AdamUpdateBeside: the inputs untouched, and the outputs bit for bit what
// the in-place update leaves, for every length up to three vectors and a
// long odd one, with outputs aligned to a vector (non-temporal stores) and
// not (plain ones), and nothing written outside them.
TEST_P(AdamKernelTest, BesideTheStateIsTheInPlaceUpdate) {
  AdamHyperParams hp;
  hp.weight_decay = 0.1;
  std::mt19937 rng(7);
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 49; ++n) lengths.push_back(n);
  lengths.push_back(4099);
  for (const bool adam_w : {true, false}) {
    hp.adam_w_mode = adam_w;
    const AdamStepConstants c = MakeAdamStepConstants(hp, 4, 0.25);
    for (const size_t out_offset : {size_t{0}, size_t{3}}) {
      for (size_t n : lengths) {
        SCOPED_TRACE(::testing::Message()
                     << "adam_w=" << adam_w << " out_offset=" << out_offset << " n=" << n);
        std::vector<float> p0(n), m0(n), v0(n);
        GradBuffer grad(DType::kBFloat16, n, 1);
        FillRandomState(rng, p0, m0, v0, grad);
        std::vector<float> p(p0), m(m0), v(v0);
        std::vector<uint16_t> copy(n), copy_beside(n);
        RunAdam(GetParam(), c, grad.ptr(), p.data(), m.data(), v.data(),
                {copy.data(), DType::kBFloat16}, n);
        GuardedBuffer<float> po(n, out_offset), mo(n, out_offset), vo(n, out_offset);
        RunAdamBeside(GetParam(), c, grad.ptr(), p0.data(), m0.data(), v0.data(),
                      {po.data(), mo.data(), vo.data()}, {copy_beside.data(), DType::kBFloat16}, n);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_TRUE(kernel_testing::SameBits(po[i], p[i])) << "p of element " << i;
          ASSERT_TRUE(kernel_testing::SameBits(mo[i], m[i])) << "m of element " << i;
          ASSERT_TRUE(kernel_testing::SameBits(vo[i], v[i])) << "v of element " << i;
          ASSERT_EQ(copy_beside[i], copy[i]) << "copy of element " << i;
        }
        EXPECT_TRUE(po.GuardsIntact() && mo.GuardsIntact() && vo.GuardsIntact());
        // The inputs are as they were: the in-place run worked on copies.
        std::vector<float> p1(p0), m1(m0), v1(v0);
        RunAdam(GetParam(), c, grad.ptr(), p1.data(), m1.data(), v1.data(), {}, n);
        EXPECT_EQ(p1, p) << "the update of the inputs after the run beside them differs";
      }
    }
  }
}

TEST_P(AdamKernelTest, EmptyRangeTouchesNothing) {
  const AdamStepConstants c = MakeAdamStepConstants(AdamHyperParams(), 1, 1.0);
  // Real arrays with every byte set: a kernel that wrote (or read past) an
  // empty range would change one.
  std::vector<float> p(16, 1.5f), m(16, 2.5f), v(16, 3.5f);
  std::vector<uint16_t> grad(16, 0x3C00), copy(16, 0xABCD);
  RunAdam(GetParam(), c, {grad.data(), DType::kFloat16}, p.data(), m.data(), v.data(),
          {copy.data(), DType::kBFloat16}, 0);
  EXPECT_EQ(p, std::vector<float>(16, 1.5f));
  EXPECT_EQ(m, std::vector<float>(16, 2.5f));
  EXPECT_EQ(v, std::vector<float>(16, 3.5f));
  EXPECT_EQ(copy, std::vector<uint16_t>(16, 0xABCD));
  // Null arrays are fine when there is nothing to do.
  RunAdam(GetParam(), c, {nullptr, DType::kFloat16}, nullptr, nullptr, nullptr,
          {nullptr, DType::kBFloat16}, 0);
}

INSTANTIATE_TEST_SUITE_P(Paths, AdamKernelTest, ::testing::ValuesIn(AllKernelPaths()),
                         [](const auto& info) { return info.param.name; });

TEST(AdamStepConstantsTest, FollowsTorchDefinitions) {
  AdamHyperParams hp{1e-3, 0.9, 0.999, 1e-8, 0.01, true, true};
  AdamStepConstants c = MakeAdamStepConstants(hp, 3, 0.25);
  EXPECT_FLOAT_EQ(c.step_size, 1e-3 / (1 - 0.9 * 0.9 * 0.9));
  EXPECT_FLOAT_EQ(c.inv_sqrt_bias2, 1 / std::sqrt(1 - 0.999 * 0.999 * 0.999));
  EXPECT_EQ(c.grad_scale, 0.25f);
  EXPECT_EQ(c.weight_decay, 0.0f);
  EXPECT_FLOAT_EQ(c.decay_factor, 1 - 1e-3 * 0.01);
  hp.adam_w_mode = false;
  hp.bias_correction = false;
  c = MakeAdamStepConstants(hp, 3, 0.25);
  EXPECT_EQ(c.step_size, 1e-3f);
  EXPECT_EQ(c.inv_sqrt_bias2, 1.0f);
  EXPECT_EQ(c.weight_decay, 0.01f);
  EXPECT_EQ(c.decay_factor, 1.0f);
}

}  // namespace
}  // namespace zo
