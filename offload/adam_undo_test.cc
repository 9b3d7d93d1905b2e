#include "offload/adam_undo.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "offload/optimizer_kernels.h"
#include "offload/optimizer_kernels_test_util.h"

namespace zo {
namespace {

using kernel_testing::KernelPath;

// A state after one real AdamUpdate on the path under test, and the old
// weights rounded as the kernel wrote them.
struct Stepped {
  std::vector<float> p0, p, m, v;
  std::vector<uint16_t> old_copy;
};

Stepped Step(const KernelPath& path, const AdamStepConstants& c, DType dtype, size_t n,
             float weight_scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Stepped s;
  s.p0.resize(n);
  s.m.resize(n);
  s.v.resize(n);
  kernel_testing::GradBuffer grad(DType::kFloat32, n, 0);
  for (size_t i = 0; i < n; ++i) {
    s.p0[i] = normal(rng) * weight_scale;
    const float g = normal(rng) * 1e-3f * static_cast<float>(1 + i % 7);
    // Some elements never had a gradient: zero moments, a step of decay only.
    const bool idle = i % 97 == 3;
    s.m[i] = idle ? 0.0f : 0.1f * g;
    s.v[i] = idle ? 0.0f : 0.05f * g * g;
    grad.Set(i, idle ? 0.0f : g);
  }
  s.p = s.p0;
  s.old_copy.assign(n, 0);
  kernel_testing::RunAdam(path, c, grad.ptr(), s.p.data(), s.m.data(), s.v.data(),
                          {s.old_copy.data(), dtype}, n, CopyOf::kOldWeight);
  return s;
}

class AdamUndoTest : public ::testing::TestWithParam<KernelPath> {
 protected:
  void SetUp() override {
    if (std::string why = kernel_testing::Unsupported(GetParam()); !why.empty())
      GTEST_SKIP() << why;
  }
};

// The recomputed rounding equals the kernel's copy of the old weight almost
// everywhere, and where it does not (weights of usual size) it is the
// neighbouring 16-bit value: the corrections a server keeps are few and the
// idea holds on every path. A weight far smaller than its step loses more
// of its bits to the step's rounding (still rare).
TEST_P(AdamUndoTest, GivesTheOldWeightsRoundedButForRareNeighbours) {
  struct Recipe {
    const char* name;
    AdamHyperParams hp;
    int64_t step;
    float weight_scale;
    double max_mismatch;  // fraction of elements
    bool neighbours_only = true;
  };
  const Recipe recipes[] = {
      {"adamw_1e-3", {1e-3, 0.9, 0.999, 1e-8, 0.01, true, true}, 1, 0.02f, 1e-4},
      {"adamw_1e-4_wd0.1", {1e-4, 0.9, 0.999, 1e-8, 0.1, true, true}, 20, 0.02f, 1e-4},
      {"adam_l2", {1e-3, 0.9, 0.999, 1e-8, 0.01, false, true}, 7, 0.5f, 1e-4},
      // Tiny weights and a large lr: the step dwarfs the weight.
      {"large_lr_tiny_weights", {1e-2, 0.9, 0.999, 1e-8, 0.0, true, true}, 1, 1e-3f, 5e-3, false},
  };
  constexpr size_t kElems = 1 << 18;
  for (const Recipe& r : recipes) {
    const AdamStepConstants c = MakeAdamStepConstants(r.hp, r.step, 1.0);
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      const Stepped s = Step(GetParam(), c, dtype, kElems, r.weight_scale, 7);
      std::vector<uint16_t> undone(kElems);
      RoundWeightsBeforeAdamStep(c, s.p.data(), s.m.data(), s.v.data(), {undone.data(), dtype},
                                 kElems);
      size_t mismatches = 0;
      for (size_t i = 0; i < kElems; ++i) {
        if (undone[i] == s.old_copy[i]) continue;
        ++mismatches;
        const int distance =
            std::abs(static_cast<int>(undone[i]) - static_cast<int>(s.old_copy[i]));
        if (r.neighbours_only) {
          ASSERT_LE(distance, 1) << r.name << " " << DTypeName(dtype) << " element " << i;
        }
      }
      EXPECT_LE(static_cast<double>(mismatches) / kElems, r.max_mismatch)
          << r.name << " " << DTypeName(dtype) << ": " << mismatches << " of " << kElems;
      std::printf("%-22s %-4s %-8s %6zu of %zu differ\n", r.name,
                  std::string(DTypeName(dtype)).c_str(), GetParam().name.c_str(), mismatches,
                  kElems);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, AdamUndoTest, ::testing::ValuesIn(kernel_testing::AllKernelPaths()),
                         [](const auto& info) { return info.param.name; });

// A range recomputed in pieces, at any start and length, gives the bits of
// the whole: a pull reads what the update checked, whatever its bounds.
TEST(AdamUndoDeterminismTest, PiecesGiveTheBitsOfTheWhole) {
  AdamHyperParams hp;
  hp.weight_decay = 0.1;
  const AdamStepConstants c = MakeAdamStepConstants(hp, 3, 1.0);
  constexpr size_t kElems = 5000;
  const Stepped s = Step({"dispatch", ActiveSimdLevel()}, c, DType::kFloat16, kElems, 0.02f, 11);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const size_t size = DTypeSize(dtype);
    std::vector<uint8_t> whole(kElems * size), pieces(kElems * size, 0xEE);
    RoundWeightsBeforeAdamStep(c, s.p.data(), s.m.data(), s.v.data(), {whole.data(), dtype},
                               kElems);
    std::mt19937 rng(3);
    for (size_t at = 0; at < kElems;) {
      const size_t len = std::min<size_t>(kElems - at, rng() % 1100);
      RoundWeightsBeforeAdamStep(c, s.p.data() + at, s.m.data() + at, s.v.data() + at,
                                 {pieces.data() + at * size, dtype}, len);
      at += len;
    }
    EXPECT_EQ(pieces, whole) << DTypeName(dtype);
  }
}

// The fp32 value is the step undone: against a double-precision inverse of
// the same formula, a few fp32 roundings apart.
TEST(AdamUndoDeterminismTest, Fp32ValueIsTheStepUndone) {
  AdamHyperParams hp;
  hp.weight_decay = 0.05;
  const AdamStepConstants c = MakeAdamStepConstants(hp, 5, 1.0);
  constexpr size_t kElems = 4099;
  const Stepped s = Step({"scalar", SimdLevel::kScalar}, c, DType::kFloat16, kElems, 0.3f, 13);
  std::vector<float> undone(kElems);
  RoundWeightsBeforeAdamStep(c, s.p.data(), s.m.data(), s.v.data(),
                             {undone.data(), DType::kFloat32}, kElems);
  for (size_t i = 0; i < kElems; ++i) {
    const double step =
        static_cast<double>(c.step_size) *
        (s.m[i] / (std::sqrt(static_cast<double>(s.v[i])) * c.inv_sqrt_bias2 + c.eps));
    const double expected = (s.p[i] + step) / c.decay_factor;
    const double scale = std::abs(s.p[i]) + std::abs(step);
    ASSERT_NEAR(undone[i], expected, scale * 8 * kernel_testing::kUnitRoundoff) << "element " << i;
    // And the old weight itself, up to the step's own rounding of p.
    ASSERT_NEAR(undone[i], s.p0[i], scale * 8 * kernel_testing::kUnitRoundoff) << "element " << i;
    // Bit for bit the plain fp32 formula (this file is built for baseline
    // x86-64, which has no FMA to contract it into): the vector path the
    // host picked rounds like scalar code, so corrections found on one
    // machine's path hold on any other's.
    const float plain =
        (s.p[i] + c.step_size * (s.m[i] / (std::sqrt(s.v[i]) * c.inv_sqrt_bias2 + c.eps))) /
        c.decay_factor;
    ASSERT_TRUE(kernel_testing::SameBits(undone[i], plain)) << "element " << i;
  }
  RoundWeightsBeforeAdamStep(c, nullptr, nullptr, nullptr, {nullptr, DType::kFloat16}, 0);
}

// The filter finds exactly what undoing every element and comparing finds,
// over recipes that put many old weights near rounding boundaries (tiny
// weights, a large lr), fp16's subnormal and overflow ranges, non-finite
// values, a strong decay, and every kernel path of the step.
TEST(FindUndoMismatchesTest, FindsWhatComparingEveryElementFinds) {
  struct Recipe {
    const char* name;
    AdamHyperParams hp;
    int64_t step;
    float weight_scale;
  };
  const Recipe recipes[] = {
      {"usual", {1e-3, 0.9, 0.999, 1e-8, 0.01, true, true}, 3, 0.02f},
      {"large_lr_tiny_weights", {1e-2, 0.9, 0.999, 1e-8, 0.0, true, true}, 1, 1e-3f},
      {"fp16_subnormal_weights", {1e-6, 0.9, 0.999, 1e-8, 0.0, true, true}, 2, 1e-5f},
      {"huge_weights", {1e-3, 0.9, 0.999, 1e-8, 0.0, true, true}, 2, 3e4f},
      {"adam_l2", {3e-3, 0.9, 0.999, 1e-8, 0.1, false, true}, 9, 0.5f},
      {"strong_decay", {0.9, 0.9, 0.999, 1e-8, 0.9, true, true}, 1, 1.0f},
      {"eps_zero", {1e-3, 0.9, 0.999, 0.0, 0.0, true, false}, 1, 0.1f},
  };
  constexpr size_t kElems = 1 << 16;
  int64_t found_total = 0;
  for (const KernelPath& path : kernel_testing::AllKernelPaths()) {
    if (!kernel_testing::Unsupported(path).empty()) continue;
    for (const Recipe& r : recipes) {
      const AdamStepConstants c = MakeAdamStepConstants(r.hp, r.step, 1.0);
      for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
        Stepped s = Step(path, c, DType::kFloat16, kElems, r.weight_scale, 21);
        // Non-finite values among them (the filter must leave them to the
        // undo).
        s.p[7] = std::numeric_limits<float>::infinity();
        s.p0[9] = std::numeric_limits<float>::quiet_NaN();
        const size_t size = DTypeSize(dtype);
        std::vector<uint8_t> undone(kElems * size), truth(kElems * size);
        RoundWeightsBeforeAdamStep(c, s.p.data(), s.m.data(), s.v.data(), {undone.data(), dtype},
                                   kElems);
        std::vector<uint32_t> want_index;
        std::vector<uint8_t> want_values;
        for (size_t i = 0; i < kElems; ++i) {
          uint8_t t[4];
          if (dtype == DType::kFloat32) {
            std::memcpy(t, &s.p0[i], 4);
          } else {
            const uint16_t h = kernel_testing::LowBits(dtype, s.p0[i]);
            std::memcpy(t, &h, 2);
          }
          if (std::memcmp(t, undone.data() + i * size, size) == 0) continue;
          want_index.push_back(static_cast<uint32_t>(i));
          want_values.insert(want_values.end(), t, t + size);
        }
        std::vector<uint32_t> index;
        std::vector<uint8_t> values;
        FindUndoMismatches(c, s.p0.data(), s.p.data(), s.m.data(), s.v.data(), dtype, kElems,
                           &index, &values);
        ASSERT_EQ(index, want_index) << path.name << " " << r.name << " " << DTypeName(dtype);
        ASSERT_EQ(values, want_values) << path.name << " " << r.name << " " << DTypeName(dtype);
        found_total += static_cast<int64_t>(index.size());
      }
    }
  }
  EXPECT_GT(found_total, 0) << "the recipes do reach rounding boundaries";
}

}  // namespace
}  // namespace zo
