// AVX-512 optimizer kernels: 16 fp32 lanes per vector, masked tails (masked
// loads and stores never touch the lanes past n). Compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mf16c -mfma; see
// optimizer_kernels_isa.h for what this file may include.
//
// Every kernel is instantiated per (gradient type, copy type, decay mode), so
// the loop body has no per-element branch. The arithmetic follows the scalar
// reference in optimizer_kernels.cc operation by operation, except that
// a*b+c pairs are fused (FMA). Plain stores and no software prefetch: on
// Zen 4 the Adam loop already runs at the rate of a STREAM-style loop with
// the same loads and stores, and non-temporal stores for the copy or
// prefetching measured no faster (slower when the range fits in cache).
// The update beside the state (AdamArrays with `stream`) is the exception:
// its outputs are lines the loop never read, and without non-temporal
// stores each is read for ownership first (64 Mi elements on 2 cores: 1.6x
// the in-place update with plain stores, 1.1x with streaming ones).
#include "offload/internal/optimizer_kernels_isa.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace zo::offload_internal {
namespace {

constexpr size_t kLanes = 16;
constexpr int kRoundNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
// GCC 12's unmasked forms of several intrinsics start from an "undefined"
// register and trip -Wmaybe-uninitialized (GCC PR 105593); the zero-masked
// forms with every lane selected are the same operation without the warning.
constexpr __mmask16 kAll = 0xFFFF;
constexpr __mmask8 kAll8 = 0xFF;

// How the copy of the new master is written; bf16 has two implementations.
enum class Copy { kNone, kF32, kF16, kBf16Int, kBf16Insn };

// Compile-time values passed to generic lambdas.
template <auto V>
struct Tag {
  static constexpr auto value = V;
};

template <typename F>
inline void WithSrc(SrcType t, F&& f) {
  switch (t) {
    case SrcType::kF32:
      return f(Tag<SrcType::kF32>{});
    case SrcType::kF16:
      return f(Tag<SrcType::kF16>{});
    case SrcType::kBf16:
      return f(Tag<SrcType::kBf16>{});
  }
}

template <typename F>
inline void WithCopy(CopyType t, bool use_bf16_insn, F&& f) {
  switch (t) {
    case CopyType::kNone:
      return f(Tag<Copy::kNone>{});
    case CopyType::kF32:
      return f(Tag<Copy::kF32>{});
    case CopyType::kF16:
      return f(Tag<Copy::kF16>{});
    case CopyType::kBf16:
      if (use_bf16_insn) return f(Tag<Copy::kBf16Insn>{});
      return f(Tag<Copy::kBf16Int>{});
  }
}

template <typename F>
inline void WithBool(bool b, F&& f) {
  if (b) return f(Tag<true>{});
  return f(Tag<false>{});
}

// Runs body(i, mask, Tag<tail>) over [0, n) in steps of 16 lanes; only the
// last, partial step is masked (kTail), the others use plain loads/stores.
template <typename Body>
inline void ForEachVector(size_t n, Body body) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) body(i, kAll, Tag<false>{});
  if (i < n) body(i, static_cast<__mmask16>((1u << (n - i)) - 1u), Tag<true>{});
}

template <bool kTail>
inline __m512 LoadF32(const float* p, __mmask16 k) {
  if constexpr (kTail) return _mm512_maskz_loadu_ps(k, p);
  return _mm512_loadu_ps(p);
}

template <bool kTail>
inline void StoreF32(float* p, __mmask16 k, __m512 x) {
  if constexpr (kTail) return _mm512_mask_storeu_ps(p, k, x);
  _mm512_storeu_ps(p, x);
}

template <bool kTail>
inline __m256i Load16(const uint16_t* p, __mmask16 k) {
  if constexpr (kTail) return _mm256_maskz_loadu_epi16(k, p);
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

template <bool kTail>
inline void Store16(uint16_t* p, __mmask16 k, __m256i x) {
  if constexpr (kTail) return _mm256_mask_storeu_epi16(p, k, x);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), x);
}

// 16 source values at element offset i, decoded exactly to fp32.
template <SrcType kType, bool kTail>
inline __m512 LoadSrc(const void* src, size_t i, __mmask16 k) {
  if constexpr (kType == SrcType::kF32) {
    return LoadF32<kTail>(static_cast<const float*>(src) + i, k);
  } else {
    const __m256i h = Load16<kTail>(static_cast<const uint16_t*>(src) + i, k);
    if constexpr (kType == SrcType::kF16) return _mm512_maskz_cvtph_ps(kAll, h);
    const __m512i wide = _mm512_maskz_cvtepu16_epi32(kAll, h);
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll, wide, 16));
  }
}

// Integer-arithmetic round to nearest even, NaN quieted: the arithmetic of
// FloatToBf16Bits (common/bf16.h). Returns the 16 bf16 results packed.
inline __m256i RoundToBf16(__m512i x) {
  const __m512i abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF));
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7F800000));
  const __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(kAll, x, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), lsb);
  r = _mm512_mask_or_epi32(r, is_nan, x, _mm512_set1_epi32(0x00400000));
  return _mm512_maskz_cvtepi32_epi16(kAll, _mm512_maskz_srli_epi32(kAll, r, 16));
}

// VCVTNEPS2BF16 flushes fp32 subnormals to zero and has its own NaN result;
// those lanes (rare: a master weight is almost never subnormal) are redone in
// integer arithmetic so the copy always equals the scalar reference.
inline __m256i InsnToBf16(__m512 f) {
  const __m256i hw = (__m256i)_mm512_cvtneps_pbh(f);
  const __m512i x = _mm512_castps_si512(f);
  const __m512i abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF));
  // abs - 1 < 0x7FFFFF (unsigned) <=> abs in [1, 0x7FFFFF]: nonzero subnormal.
  const __mmask16 subnormal = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(abs, _mm512_set1_epi32(1)),
                                                      _mm512_set1_epi32(0x007FFFFF));
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7F800000));
  const __mmask16 fix = subnormal | nan;
  if (fix == 0) return hw;
  return _mm256_mask_blend_epi16(fix, hw, RoundToBf16(x));
}

// Writes the copy of 16 new master values at element offset i.
template <Copy kCopy, bool kTail>
inline void StoreCopy(void* dst, size_t i, __mmask16 k, __m512 p) {
  if constexpr (kCopy == Copy::kF32) {
    StoreF32<kTail>(static_cast<float*>(dst) + i, k, p);
  } else if constexpr (kCopy != Copy::kNone) {
    __m256i h;
    if constexpr (kCopy == Copy::kF16) h = _mm512_maskz_cvtps_ph(kAll, p, kRoundNearest);
    if constexpr (kCopy == Copy::kBf16Int) h = RoundToBf16(_mm512_castps_si512(p));
    if constexpr (kCopy == Copy::kBf16Insn) h = InsnToBf16(p);
    Store16<kTail>(static_cast<uint16_t*>(dst) + i, k, h);
  }
}

// ---- Adam ----

struct AdamVec {
  __m512 grad_scale, beta1, beta2, one_minus_beta1, one_minus_beta2;
  __m512 step_size, inv_sqrt_bias2, eps, weight_decay, decay_factor;
};

// 16 floats to `p`: masked in the tail; otherwise with kStream a
// non-temporal store (p 64-byte aligned).
template <bool kTail, bool kStream>
inline void StoreOut(float* p, __mmask16 k, __m512 x) {
  if constexpr (kStream && !kTail) {
    _mm512_stream_ps(p, x);
  } else {
    StoreF32<kTail>(p, k, x);
  }
}

template <SrcType kSrc, Copy kCopy, bool kL2, bool kStream>
void AdamLoop(const AdamArgs& a, const KernelIo& io, const AdamArrays& s, size_t n) {
  const AdamVec c = {_mm512_set1_ps(a.grad_scale),      _mm512_set1_ps(a.beta1),
                     _mm512_set1_ps(a.beta2),           _mm512_set1_ps(a.one_minus_beta1),
                     _mm512_set1_ps(a.one_minus_beta2), _mm512_set1_ps(a.step_size),
                     _mm512_set1_ps(a.inv_sqrt_bias2),  _mm512_set1_ps(a.eps),
                     _mm512_set1_ps(a.weight_decay),    _mm512_set1_ps(a.decay_factor)};
  const void* const grad = io.grad;  // locals: stores through float* may alias io
  void* const copy = io.copy;
  const bool copy_old = io.copy_old;
  const float *const p = s.p, *const m = s.m, *const v = s.v;
  float *const po = s.p_out, *const mo = s.m_out, *const vo = s.v_out;
  ForEachVector(n, [&](size_t i, __mmask16 k, auto tail) {
    constexpr bool kTail = decltype(tail)::value;
    const __m512 p0 = LoadF32<kTail>(p + i, k);
    __m512 g = _mm512_mul_ps(LoadSrc<kSrc, kTail>(grad, i, k), c.grad_scale);
    if constexpr (kL2) g = _mm512_fmadd_ps(c.weight_decay, p0, g);
    const __m512 param = _mm512_mul_ps(p0, c.decay_factor);
    const __m512 m1 =
        _mm512_fmadd_ps(c.beta1, LoadF32<kTail>(m + i, k), _mm512_mul_ps(c.one_minus_beta1, g));
    const __m512 v1 = _mm512_fmadd_ps(_mm512_mul_ps(c.one_minus_beta2, g), g,
                                      _mm512_mul_ps(c.beta2, LoadF32<kTail>(v + i, k)));
    const __m512 denom = _mm512_fmadd_ps(_mm512_maskz_sqrt_ps(kAll, v1), c.inv_sqrt_bias2, c.eps);
    const __m512 p1 = _mm512_fnmadd_ps(c.step_size, _mm512_div_ps(m1, denom), param);
    StoreOut<kTail, kStream>(mo + i, k, m1);
    StoreOut<kTail, kStream>(vo + i, k, v1);
    StoreOut<kTail, kStream>(po + i, k, p1);
    StoreCopy<kCopy, kTail>(copy, i, k, copy_old ? p0 : p1);
  });
  if constexpr (kStream) _mm_sfence();
}

// ---- Adagrad ----

template <SrcType kSrc, Copy kCopy, bool kL2>
void AdagradLoop(const AdagradArgs& a, const KernelIo& io, float* p, float* sum, size_t n) {
  const __m512 grad_scale = _mm512_set1_ps(a.grad_scale), lr = _mm512_set1_ps(a.lr);
  const __m512 eps = _mm512_set1_ps(a.eps), weight_decay = _mm512_set1_ps(a.weight_decay);
  const void* const grad = io.grad;  // locals: stores through float* may alias io
  void* const copy = io.copy;
  ForEachVector(n, [&](size_t i, __mmask16 k, auto tail) {
    constexpr bool kTail = decltype(tail)::value;
    const __m512 p0 = LoadF32<kTail>(p + i, k);
    __m512 g = _mm512_mul_ps(LoadSrc<kSrc, kTail>(grad, i, k), grad_scale);
    if constexpr (kL2) g = _mm512_fmadd_ps(weight_decay, p0, g);
    const __m512 s1 = _mm512_fmadd_ps(g, g, LoadF32<kTail>(sum + i, k));
    const __m512 denom = _mm512_add_ps(_mm512_maskz_sqrt_ps(kAll, s1), eps);
    const __m512 p1 = _mm512_fnmadd_ps(lr, _mm512_div_ps(g, denom), p0);
    StoreF32<kTail>(sum + i, k, s1);
    StoreF32<kTail>(p + i, k, p1);
    StoreCopy<kCopy, kTail>(copy, i, k, p1);
  });
}

// ---- Lion ----

template <SrcType kSrc, Copy kCopy>
void LionLoop(const LionArgs& a, const KernelIo& io, float* p, float* m, size_t n) {
  const __m512 grad_scale = _mm512_set1_ps(a.grad_scale), lr = _mm512_set1_ps(a.lr);
  const __m512 beta1 = _mm512_set1_ps(a.beta1), beta2 = _mm512_set1_ps(a.beta2);
  const __m512 one_minus_beta1 = _mm512_set1_ps(1.0f - a.beta1);
  const __m512 one_minus_beta2 = _mm512_set1_ps(1.0f - a.beta2);
  const __m512 decay_factor = _mm512_set1_ps(a.decay_factor);
  const __m512 sign_bit = _mm512_set1_ps(-0.0f), one = _mm512_set1_ps(1.0f);
  const void* const grad = io.grad;  // locals: stores through float* may alias io
  void* const copy = io.copy;
  ForEachVector(n, [&](size_t i, __mmask16 k, auto tail) {
    constexpr bool kTail = decltype(tail)::value;
    const __m512 g = _mm512_mul_ps(LoadSrc<kSrc, kTail>(grad, i, k), grad_scale);
    const __m512 m0 = LoadF32<kTail>(m + i, k);
    const __m512 blend = _mm512_fmadd_ps(beta1, m0, _mm512_mul_ps(one_minus_beta1, g));
    // torch.sign: copysign(1, x) where x != 0, 0 where x == 0, x where NaN.
    __m512 sign = _mm512_or_ps(_mm512_and_ps(blend, sign_bit), one);
    sign = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(blend, _mm512_setzero_ps(), _CMP_NEQ_UQ), sign);
    sign = _mm512_mask_mov_ps(sign, _mm512_cmp_ps_mask(blend, blend, _CMP_UNORD_Q), blend);
    const __m512 p1 =
        _mm512_fnmadd_ps(lr, sign, _mm512_mul_ps(LoadF32<kTail>(p + i, k), decay_factor));
    const __m512 m1 = _mm512_fmadd_ps(beta2, m0, _mm512_mul_ps(one_minus_beta2, g));
    StoreF32<kTail>(m + i, k, m1);
    StoreF32<kTail>(p + i, k, p1);
    StoreCopy<kCopy, kTail>(copy, i, k, p1);
  });
}

// ---- accumulation and statistics ----

// Sum of squares in two double accumulators. The square of any finite float
// is below 2^256, so the double sum of fewer than 2^64 of them is finite: the
// sum is non-finite exactly when an input was NaN or +-Inf, which makes the
// non-finite flag free.
struct SumSquares {
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  void Add(__m512 x) {
    const __m512d a = _mm512_maskz_cvtps_pd(kAll8, _mm512_maskz_extractf32x8_ps(kAll8, x, 0));
    const __m512d b = _mm512_maskz_cvtps_pd(kAll8, _mm512_maskz_extractf32x8_ps(kAll8, x, 1));
    lo = _mm512_fmadd_pd(a, a, lo);
    hi = _mm512_fmadd_pd(b, b, hi);
  }
  KernelStats Result() const {
    const __m512d s8 = _mm512_add_pd(lo, hi);
    const __m256d s4 = _mm256_add_pd(_mm512_maskz_extractf64x4_pd(0xF, s8, 0),
                                     _mm512_maskz_extractf64x4_pd(0xF, s8, 1));
    const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
    const double s = _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
    return {s, !__builtin_isfinite(s)};
  }
};

template <SrcType kSrc, bool kOverwrite, bool kStats>
void AccumulateLoop(const void* src, float* acc, size_t n, KernelStats* stats) {
  SumSquares sum;
  ForEachVector(n, [&](size_t i, __mmask16 k, auto tail) {
    constexpr bool kTail = decltype(tail)::value;
    __m512 x = LoadSrc<kSrc, kTail>(src, i, k);
    if constexpr (!kOverwrite) x = _mm512_add_ps(LoadF32<kTail>(acc + i, k), x);
    StoreF32<kTail>(acc + i, k, x);
    if constexpr (kStats) sum.Add(x);  // masked-off lanes are 0
  });
  if constexpr (kStats) *stats = sum.Result();
}

}  // namespace

void AdamAvx512(const AdamArgs& a, const KernelIo& io, const AdamArrays& s, size_t n,
                bool use_bf16_insn) {
  const auto aligned = [](const float* x) { return reinterpret_cast<uintptr_t>(x) % 64 == 0; };
  const bool stream = s.stream && aligned(s.p_out) && aligned(s.m_out) && aligned(s.v_out);
  WithSrc(io.grad_type, [&](auto src) {
    WithCopy(io.copy_type, use_bf16_insn, [&](auto copy) {
      WithBool(a.weight_decay != 0.0f, [&](auto l2) {
        WithBool(stream, [&](auto st) {
          AdamLoop<src.value, copy.value, l2.value, st.value>(a, io, s, n);
        });
      });
    });
  });
}

void AdagradAvx512(const AdagradArgs& a, const KernelIo& io, float* p, float* sum, size_t n,
                   bool use_bf16_insn) {
  WithSrc(io.grad_type, [&](auto src) {
    WithCopy(io.copy_type, use_bf16_insn, [&](auto copy) {
      WithBool(a.weight_decay != 0.0f,
               [&](auto l2) { AdagradLoop<src.value, copy.value, l2.value>(a, io, p, sum, n); });
    });
  });
}

void LionAvx512(const LionArgs& a, const KernelIo& io, float* p, float* m, size_t n,
                bool use_bf16_insn) {
  WithSrc(io.grad_type, [&](auto src) {
    WithCopy(io.copy_type, use_bf16_insn,
             [&](auto copy) { LionLoop<src.value, copy.value>(a, io, p, m, n); });
  });
}

void AccumulateAvx512(const void* src, SrcType type, float* acc, size_t n, bool overwrite,
                      KernelStats* stats) {
  WithSrc(type, [&](auto t) {
    WithBool(overwrite, [&](auto ow) {
      WithBool(stats != nullptr,
               [&](auto st) { AccumulateLoop<t.value, ow.value, st.value>(src, acc, n, stats); });
    });
  });
}

KernelStats StatsAvx512(const void* src, SrcType type, size_t n) {
  KernelStats result{0.0, false};
  WithSrc(type, [&](auto t) {
    SumSquares sum;
    ForEachVector(n, [&](size_t i, __mmask16 k, auto tail) {
      sum.Add(LoadSrc<t.value, decltype(tail)::value>(src, i, k));
    });
    result = sum.Result();
  });
  return result;
}

}  // namespace zo::offload_internal

#endif  // defined(__x86_64__)
