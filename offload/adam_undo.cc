#include "offload/adam_undo.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/convert.h"
#include "common/cpu_features.h"

// Built with -ffp-contract=off (offload/CMakeLists.txt): a contracted
// p + step_size * q would round once where the scalar tail rounds twice.

namespace zo {
namespace {

// Elements per pass: the fp32 values stay in L1 between the arithmetic and
// the rounding.
constexpr size_t kBlock = 1024;

// The two loops below are built for AVX2 and AVX-512 too and picked by
// ActiveSimdLevel() (no ifunc: its resolvers run before a sanitizer's
// runtime is up). Safe for the undo's determinism: every ISA gives IEEE add,
// mul, div and sqrt the same bits (and the filter only decides where to
// look). `target` without `fma`, so nothing can be contracted either.
#if defined(__x86_64__) && defined(__GNUC__)
#define ZO_UNDO_MULTI_ISA 1
#define ZO_UNDO_AVX2 __attribute__((target("avx2")))
#define ZO_UNDO_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#endif
#define ZO_UNDO_BODY inline __attribute__((always_inline))

ZO_UNDO_BODY void UndoBlockBody(const AdamStepConstants& c, const float* __restrict p,
                                const float* __restrict m, const float* __restrict v,
                                float* __restrict out, size_t n) {
  const float step_size = c.step_size, inv_sqrt_bias2 = c.inv_sqrt_bias2, eps = c.eps;
  const float decay = c.decay_factor;
  for (size_t i = 0; i < n; ++i) {
    const float denom = std::sqrt(v[i]) * inv_sqrt_bias2 + eps;
    out[i] = (p[i] + step_size * (m[i] / denom)) / decay;
  }
}

// Bound on |undo - old weight| (before rounding to 16 bits), for a forward
// step p = fl(fl(old * decay) - u_f) or its FMA form (every kernel path in
// optimizer_kernels.h) and the undo y = fl(fl(p + u) / decay) above, with
// decay >= 0.5. The kernels' u_f and the undo's u come from the same m, v
// and constants: the AVX paths round sqrt(v) * inv_sqrt_bias2 + eps once
// (FMA) where the undo rounds twice, and fold step_size into the FMA, so
// |u - u_f| <= 6.1 * 2^-24 |u_f|. With each rounding's relative error at
// most 2^-24 (unit roundoff r) and |u_f| <= |old| decay + |p| (1 + 2r):
//   |y - old| <= r (3.01 |old| + 1.01 (9.1 (|old| decay + |p|) + 1.01 |p|) / decay)
//             <= r (12.2 |old| + 20.6 |p|)            (decay >= 0.5)
//             <  2^-19 (|old| + |p|) + 2^-120          (margin > 1.5x)
// where 2^-120 covers results in fp32's subnormal range (absolute errors of
// 2^-150 a rounding). Counted in fp32 ulps of old's binade (2^(e - 150) for
// biased exponent e, |old| < 2^(e - 126), |p| < 2^(e_p - 126)), that is
// under 33 + 32 * 2^max(e_p - e, 0) ulps for e >= 30.
//
// Marks (flag 1) the elements of a block whose old weight may lie within
// that many ulps of a rounding boundary of `dtype`. In old's binade the
// boundaries (midpoints between 16-bit neighbours) sit where the bits below
// the 16-bit significand are exactly one half; the one just below a power
// of two is a quarter of a 16-bit ulp from it, hence the second term of the
// min. Always marked: old weights under 2^-96 and non-finite ones, fp16's
// subnormal and overflow ranges, bf16's top binade, and any p whose binade
// is 2^20 above old's. Integers only and branch-free, so that it vectorises.
ZO_UNDO_BODY void MarkNearBoundariesBody(const float* __restrict old_p, const float* __restrict p,
                                         DType dtype, size_t n, uint8_t* __restrict near) {
  const bool half_precision = dtype == DType::kFloat16;
  // fp16 normals are [2^-14, 65504]; 65504 rounds up to inf from 65520.
  const int32_t lowest = half_precision ? 127 - 14 : 31;
  const int32_t highest = half_precision ? 127 + 15 : 0xfd;
  const int32_t low_mask = half_precision ? 0x1fff : 0xffff;  // bits below the fraction
  const int32_t half = half_precision ? 0x1000 : 0x8000;
  for (size_t i = 0; i < n; ++i) {
    const int32_t bits = std::bit_cast<int32_t>(old_p[i]) & 0x7fffffff;
    const int32_t exponent = bits >> 23;
    const int32_t p_exponent = (std::bit_cast<int32_t>(p[i]) & 0x7fffffff) >> 23;
    const int32_t low = bits & low_mask;
    const int32_t ulps = std::min(std::abs(low - half), low + half / 2);
    const int32_t above = std::clamp(p_exponent - exponent, 0, 20);
    const int32_t reach = 33 + (32 << above);
    // & rather than &&: no branches.
    const int far = static_cast<int>(exponent >= lowest) & static_cast<int>(exponent <= highest) &
                    static_cast<int>(ulps > reach);
    near[i] = static_cast<uint8_t>(far ^ 1);
  }
}

#ifdef ZO_UNDO_MULTI_ISA
ZO_UNDO_AVX2 void UndoBlockAvx2(const AdamStepConstants& c, const float* p, const float* m,
                                const float* v, float* out, size_t n) {
  UndoBlockBody(c, p, m, v, out, n);
}
ZO_UNDO_AVX512 void UndoBlockAvx512(const AdamStepConstants& c, const float* p, const float* m,
                                    const float* v, float* out, size_t n) {
  UndoBlockBody(c, p, m, v, out, n);
}
ZO_UNDO_AVX2 void MarkNearBoundariesAvx2(const float* old_p, const float* p, DType dtype, size_t n,
                                         uint8_t* near) {
  MarkNearBoundariesBody(old_p, p, dtype, n, near);
}
ZO_UNDO_AVX512 void MarkNearBoundariesAvx512(const float* old_p, const float* p, DType dtype,
                                             size_t n, uint8_t* near) {
  MarkNearBoundariesBody(old_p, p, dtype, n, near);
}
#endif

void UndoBlock(const AdamStepConstants& c, const float* p, const float* m, const float* v,
               float* out, size_t n) {
#ifdef ZO_UNDO_MULTI_ISA
  switch (ActiveSimdLevel()) {
    case SimdLevel::kAvx512:
      return UndoBlockAvx512(c, p, m, v, out, n);
    case SimdLevel::kAvx2:
      return UndoBlockAvx2(c, p, m, v, out, n);
    case SimdLevel::kScalar:
      break;
  }
#endif
  UndoBlockBody(c, p, m, v, out, n);
}

void MarkNearBoundaries(const float* old_p, const float* p, DType dtype, size_t n, uint8_t* near) {
#ifdef ZO_UNDO_MULTI_ISA
  switch (ActiveSimdLevel()) {
    case SimdLevel::kAvx512:
      return MarkNearBoundariesAvx512(old_p, p, dtype, n, near);
    case SimdLevel::kAvx2:
      return MarkNearBoundariesAvx2(old_p, p, dtype, n, near);
    case SimdLevel::kScalar:
      break;
  }
#endif
  MarkNearBoundariesBody(old_p, p, dtype, n, near);
}

}  // namespace

void FindUndoMismatches(const AdamStepConstants& c, const float* old_p, const float* p,
                        const float* m, const float* v, DType dtype, size_t n,
                        std::vector<uint32_t>* index, std::vector<uint8_t>* values) {
  const size_t size = DTypeSize(dtype);
  const bool filter = dtype != DType::kFloat32 && c.decay_factor >= 0.5f;
  alignas(64) uint8_t near[kBlock + 8];  // 8 spare: the scan reads whole words
  // The marked elements of a block, gathered, so that their undo and
  // roundings run as vectors too (the undo of an element does not depend on
  // its neighbours).
  alignas(64) float gp[kBlock], gm[kBlock], gv[kBlock], gold[kBlock];
  alignas(64) uint32_t at_index[kBlock];
  alignas(64) uint8_t undone[kBlock * 4], truth[kBlock * 4];
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t len = n - at < kBlock ? n - at : kBlock;
    if (filter) {
      MarkNearBoundaries(old_p + at, p + at, dtype, len, near);
    } else {
      std::memset(near, 1, len);
    }
    // The marked ones, eight flags at a time (nearly all words are 0).
    std::memset(near + len, 0, 8);
    size_t count = 0;
    for (size_t j = 0; j < len; j += 8) {
      uint64_t word;
      std::memcpy(&word, near + j, 8);
      while (word != 0) {
        const size_t i = at + j + static_cast<size_t>(std::countr_zero(word)) / 8;
        word &= word - 1;  // flags are 0 or 1: one bit per marked element
        at_index[count] = static_cast<uint32_t>(i);
        gp[count] = p[i];
        gm[count] = m[i];
        gv[count] = v[i];
        gold[count] = old_p[i];
        ++count;
      }
    }
    if (count == 0) continue;
    RoundWeightsBeforeAdamStep(c, gp, gm, gv, {undone, dtype}, count);
    FloatToDType(gold, dtype, truth, count);
    for (size_t k = 0; k < count; ++k) {
      if (std::memcmp(undone + k * size, truth + k * size, size) == 0) continue;
      index->push_back(at_index[k]);
      values->insert(values->end(), truth + k * size, truth + (k + 1) * size);
    }
  }
}

void RoundWeightsBeforeAdamStep(const AdamStepConstants& c, const float* p, const float* m,
                                const float* v, TypedPtr out, size_t n) {
  alignas(64) float block[kBlock];
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t len = n - at < kBlock ? n - at : kBlock;
    UndoBlock(c, p + at, m + at, v + at, block, len);
    FloatToDType(block, out.dtype, static_cast<uint8_t*>(out.data) + at * DTypeSize(out.dtype),
                 len);
  }
}

}  // namespace zo
