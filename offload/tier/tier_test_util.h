// Helpers for the tiered state tests: reproducible weights and gradients, a
// run of Adam steps, whole-state snapshots and bitwise comparison.
#ifndef ZO_OFFLOAD_TIER_TIER_TEST_UTIL_H_
#define ZO_OFFLOAD_TIER_TIER_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "offload/optimizer_kernels.h"
#include "offload/tier/tiered_state.h"

namespace zo::testing {

// Floats in [-scale, scale) that depend on (seed, i).
inline std::vector<float> Pattern(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> out(static_cast<size_t>(n));
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL;
  for (float& f : out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    f = scale * (static_cast<float>(x >> 40) / static_cast<float>(1 << 23) - 1.0f);
  }
  return out;
}

inline AdamStepConstants TestStepConstants(int64_t step) {
  AdamHyperParams hp;
  hp.lr = 1e-2;
  hp.weight_decay = 0.01;
  hp.adam_w_mode = true;
  return MakeAdamStepConstants(hp, step, /*grad_scale=*/0.5);
}

// Steps [first, first + count) with gradients Pattern(n, 1000 + step); the
// fp16 copy of the last step lands in `low_precision` (n elements).
inline absl::Status RunSteps(TieredOptimizerState& state, int first, int count,
                             std::vector<uint16_t>* low_precision) {
  const int64_t n = state.total_elems();
  low_precision->assign(static_cast<size_t>(n), 0);
  for (int step = first; step < first + count; ++step) {
    const std::vector<float> grad = Pattern(n, 1000 + static_cast<uint64_t>(step), 2.0f);
    ZO_RETURN_IF_ERROR(state.AdamStep(TestStepConstants(step), {grad.data(), DType::kFloat32},
                                      {low_precision->data(), DType::kFloat16}));
  }
  return absl::OkStatus();
}

struct StateSnapshot {
  std::vector<float> master, m, v;
};

inline absl::Status Snapshot(TieredOptimizerState& state, StateSnapshot* out) {
  const auto n = static_cast<size_t>(state.total_elems());
  out->master.assign(n, 0.0f);
  out->m.assign(n, 0.0f);
  out->v.assign(n, 0.0f);
  return state.ReadState(0, absl::MakeSpan(out->master), absl::MakeSpan(out->m),
                         absl::MakeSpan(out->v));
}

// Empty when the two arrays hold the same bits, else where they first differ.
template <typename T>
std::string FirstDifference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return absl::StrCat("sizes ", a.size(), " vs ", b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) {
      return absl::StrCat("element ", i, ": ", a[i], " vs ", b[i]);
    }
  }
  return "";
}

inline void ExpectSameBits(const StateSnapshot& a, const StateSnapshot& b) {
  EXPECT_EQ(FirstDifference(a.master, b.master), "") << "master";
  EXPECT_EQ(FirstDifference(a.m, b.m), "") << "m";
  EXPECT_EQ(FirstDifference(a.v, b.v), "") << "v";
}

}  // namespace zo::testing

#endif  // ZO_OFFLOAD_TIER_TIER_TEST_UTIL_H_
