// AVX2 + FMA + F16C optimizer kernels: 8 fp32 lanes per vector. The tail
// (< 8 elements) runs the same vector code on zero-padded stack copies, so it
// gives exactly what a full vector would. Compiled with -mavx2 -mfma -mf16c;
// see optimizer_kernels_isa.h for what this file may include.
//
// Every kernel is instantiated per (gradient type, copy type, decay mode), so
// the loop body has no per-element branch. The arithmetic follows the scalar
// reference in optimizer_kernels.cc operation by operation, except that
// a*b+c pairs are fused (FMA).
#include <string.h>

#include "offload/internal/optimizer_kernels_isa.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace zo::offload_internal {
namespace {

constexpr size_t kLanes = 8;
constexpr int kRoundNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

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
inline void WithCopy(CopyType t, F&& f) {
  switch (t) {
    case CopyType::kNone:
      return f(Tag<CopyType::kNone>{});
    case CopyType::kF32:
      return f(Tag<CopyType::kF32>{});
    case CopyType::kF16:
      return f(Tag<CopyType::kF16>{});
    case CopyType::kBf16:
      return f(Tag<CopyType::kBf16>{});
  }
}

template <typename F>
inline void WithBool(bool b, F&& f) {
  if (b) return f(Tag<true>{});
  return f(Tag<false>{});
}

constexpr size_t SrcSize(SrcType t) { return t == SrcType::kF32 ? 4 : 2; }
constexpr size_t CopySize(CopyType t) {
  return t == CopyType::kNone ? 0 : t == CopyType::kF32 ? 4 : 2;
}

inline const void* Offset(const void* base, size_t bytes) {
  return static_cast<const char*>(base) + bytes;
}
inline void* Offset(void* base, size_t bytes) { return static_cast<char*>(base) + bytes; }

// A zero-padded stack copy of the tail (< kLanes elements) of one array.
struct Scratch {
  alignas(32) unsigned char bytes[kLanes * 4] = {};
  void* Fill(const void* src, size_t size) {
    memcpy(bytes, src, size);
    return bytes;
  }
  float* FillF32(const float* src, size_t r) { return static_cast<float*>(Fill(src, r * 4)); }
  void Flush(void* dst, size_t size) const { memcpy(dst, bytes, size); }
};

// 8 source values, decoded exactly to fp32.
template <SrcType kType>
inline __m256 LoadSrc(const void* src) {
  if constexpr (kType == SrcType::kF32) return _mm256_loadu_ps(static_cast<const float*>(src));
  const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(src));
  if constexpr (kType == SrcType::kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// 8 floats -> 8 bf16, round to nearest even, NaN quieted: the arithmetic of
// FloatToBf16Bits. The byte shuffle takes each lane's high half, so no shift
// and pack are needed.
inline __m128i ToBf16(__m256 f) {
  const __m256i x = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb);
  const __m256i quiet = _mm256_or_si256(x, _mm256_set1_epi32(0x00400000));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, is_nan);
  const __m256i high_halves =
      _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1, 2, 3, 6, 7, 10,
                       11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i packed = _mm256_shuffle_epi8(r, high_halves);  // 4 results per 128-bit half
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

// Writes the copy of 8 new master values.
template <CopyType kCopy>
inline void StoreCopy(void* dst, __m256 p) {
  if constexpr (kCopy == CopyType::kF32) {
    _mm256_storeu_ps(static_cast<float*>(dst), p);
  } else if constexpr (kCopy == CopyType::kF16) {
    _mm_storeu_si128(static_cast<__m128i*>(dst), _mm256_cvtps_ph(p, kRoundNearest));
  } else if constexpr (kCopy == CopyType::kBf16) {
    _mm_storeu_si128(static_cast<__m128i*>(dst), ToBf16(p));
  }
}

// ---- Adam ----

struct AdamVec {
  __m256 grad_scale, beta1, beta2, one_minus_beta1, one_minus_beta2;
  __m256 step_size, inv_sqrt_bias2, eps, weight_decay, decay_factor;
};

// 8 floats to `dst`; with kStream a non-temporal store (dst 32-byte aligned).
template <bool kStream>
inline void StoreOut(float* dst, __m256 x) {
  if constexpr (kStream) {
    _mm256_stream_ps(dst, x);
  } else {
    _mm256_storeu_ps(dst, x);
  }
}

// One vector of the update: reads p, m, v and writes po, mo, vo (the same
// pointers in place).
template <SrcType kSrc, CopyType kCopy, bool kL2, bool kStream>
inline void AdamVector(const AdamVec& c, const void* grad, const float* p, const float* m,
                       const float* v, float* po, float* mo, float* vo, void* copy, bool copy_old) {
  const __m256 p0 = _mm256_loadu_ps(p);
  __m256 g = _mm256_mul_ps(LoadSrc<kSrc>(grad), c.grad_scale);
  if constexpr (kL2) g = _mm256_fmadd_ps(c.weight_decay, p0, g);
  const __m256 param = _mm256_mul_ps(p0, c.decay_factor);
  const __m256 m1 =
      _mm256_fmadd_ps(c.beta1, _mm256_loadu_ps(m), _mm256_mul_ps(c.one_minus_beta1, g));
  const __m256 v1 = _mm256_fmadd_ps(_mm256_mul_ps(c.one_minus_beta2, g), g,
                                    _mm256_mul_ps(c.beta2, _mm256_loadu_ps(v)));
  const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v1), c.inv_sqrt_bias2, c.eps);
  const __m256 p1 = _mm256_fnmadd_ps(c.step_size, _mm256_div_ps(m1, denom), param);
  StoreOut<kStream>(mo, m1);
  StoreOut<kStream>(vo, v1);
  StoreOut<kStream>(po, p1);
  StoreCopy<kCopy>(copy, copy_old ? p0 : p1);
}

template <SrcType kSrc, CopyType kCopy, bool kL2, bool kStream>
void AdamLoop(const AdamArgs& a, const KernelIo& io, const AdamArrays& s, size_t n) {
  const AdamVec c = {_mm256_set1_ps(a.grad_scale),      _mm256_set1_ps(a.beta1),
                     _mm256_set1_ps(a.beta2),           _mm256_set1_ps(a.one_minus_beta1),
                     _mm256_set1_ps(a.one_minus_beta2), _mm256_set1_ps(a.step_size),
                     _mm256_set1_ps(a.inv_sqrt_bias2),  _mm256_set1_ps(a.eps),
                     _mm256_set1_ps(a.weight_decay),    _mm256_set1_ps(a.decay_factor)};
  constexpr size_t gs = SrcSize(kSrc), cs = CopySize(kCopy);
  const void* const grad = io.grad;  // locals: stores through float* may alias io
  void* const copy = io.copy;
  const bool copy_old = io.copy_old;
  const float *const p = s.p, *const m = s.m, *const v = s.v;
  float *const po = s.p_out, *const mo = s.m_out, *const vo = s.v_out;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    AdamVector<kSrc, kCopy, kL2, kStream>(c, Offset(grad, i * gs), p + i, m + i, v + i, po + i,
                                          mo + i, vo + i, Offset(copy, i * cs), copy_old);
  }
  if (const size_t r = n - i; r > 0) {
    Scratch sg, sp, sm, sv, sc;
    float* const tp = sp.FillF32(p + i, r);
    float* const tm = sm.FillF32(m + i, r);
    float* const tv = sv.FillF32(v + i, r);
    AdamVector<kSrc, kCopy, kL2, false>(c, sg.Fill(Offset(grad, i * gs), r * gs), tp, tm, tv, tp,
                                        tm, tv, sc.bytes, copy_old);
    sp.Flush(po + i, r * 4);
    sm.Flush(mo + i, r * 4);
    sv.Flush(vo + i, r * 4);
    if constexpr (kCopy != CopyType::kNone) sc.Flush(Offset(copy, i * cs), r * cs);
  }
  if constexpr (kStream) _mm_sfence();
}

// Runs `vector(grad, p, state, copy)` on every full vector of the range, then
// once on zero-padded scratch copies of the tail, writing back only its live
// lanes: the loop of the optimizers with one state array (Adagrad, Lion).
template <SrcType kSrc, CopyType kCopy, typename Vector>
void TwoStateLoop(const KernelIo& io, float* p, float* state, size_t n, const Vector& vector) {
  constexpr size_t gs = SrcSize(kSrc), cs = CopySize(kCopy);
  const void* const grad = io.grad;  // locals: stores through float* may alias io
  void* const copy = io.copy;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    vector(Offset(grad, i * gs), p + i, state + i, Offset(copy, i * cs));
  }
  if (const size_t r = n - i; r > 0) {
    Scratch sg, sp, ss, sc;
    vector(sg.Fill(Offset(grad, i * gs), r * gs), sp.FillF32(p + i, r), ss.FillF32(state + i, r),
           sc.bytes);
    sp.Flush(p + i, r * 4);
    ss.Flush(state + i, r * 4);
    if constexpr (kCopy != CopyType::kNone) sc.Flush(Offset(copy, i * cs), r * cs);
  }
}

// ---- Adagrad ----

template <SrcType kSrc, CopyType kCopy, bool kL2>
void AdagradLoop(const AdagradArgs& a, const KernelIo& io, float* p, float* sum, size_t n) {
  const __m256 grad_scale = _mm256_set1_ps(a.grad_scale), lr = _mm256_set1_ps(a.lr);
  const __m256 eps = _mm256_set1_ps(a.eps), weight_decay = _mm256_set1_ps(a.weight_decay);
  const auto vector = [&](const void* gp, float* pp, float* ss, void* cp) {
    const __m256 p0 = _mm256_loadu_ps(pp);
    __m256 g = _mm256_mul_ps(LoadSrc<kSrc>(gp), grad_scale);
    if constexpr (kL2) g = _mm256_fmadd_ps(weight_decay, p0, g);
    const __m256 s1 = _mm256_fmadd_ps(g, g, _mm256_loadu_ps(ss));
    const __m256 denom = _mm256_add_ps(_mm256_sqrt_ps(s1), eps);
    const __m256 p1 = _mm256_fnmadd_ps(lr, _mm256_div_ps(g, denom), p0);
    _mm256_storeu_ps(ss, s1);
    _mm256_storeu_ps(pp, p1);
    StoreCopy<kCopy>(cp, p1);
  };
  TwoStateLoop<kSrc, kCopy>(io, p, sum, n, vector);
}

// ---- Lion ----

template <SrcType kSrc, CopyType kCopy>
void LionLoop(const LionArgs& a, const KernelIo& io, float* p, float* m, size_t n) {
  const __m256 grad_scale = _mm256_set1_ps(a.grad_scale), lr = _mm256_set1_ps(a.lr);
  const __m256 beta1 = _mm256_set1_ps(a.beta1), beta2 = _mm256_set1_ps(a.beta2);
  const __m256 one_minus_beta1 = _mm256_set1_ps(1.0f - a.beta1);
  const __m256 one_minus_beta2 = _mm256_set1_ps(1.0f - a.beta2);
  const __m256 decay_factor = _mm256_set1_ps(a.decay_factor);
  const __m256 sign_bit = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
  const auto vector = [&](const void* gp, float* pp, float* mm, void* cp) {
    const __m256 g = _mm256_mul_ps(LoadSrc<kSrc>(gp), grad_scale);
    const __m256 m0 = _mm256_loadu_ps(mm);
    const __m256 blend = _mm256_fmadd_ps(beta1, m0, _mm256_mul_ps(one_minus_beta1, g));
    // torch.sign: copysign(1, x) where x != 0, 0 where x == 0, x where NaN.
    __m256 sign = _mm256_or_ps(_mm256_and_ps(blend, sign_bit), one);
    sign = _mm256_and_ps(sign, _mm256_cmp_ps(blend, _mm256_setzero_ps(), _CMP_NEQ_UQ));
    sign = _mm256_blendv_ps(sign, blend, _mm256_cmp_ps(blend, blend, _CMP_UNORD_Q));
    const __m256 p1 = _mm256_fnmadd_ps(lr, sign, _mm256_mul_ps(_mm256_loadu_ps(pp), decay_factor));
    const __m256 m1 = _mm256_fmadd_ps(beta2, m0, _mm256_mul_ps(one_minus_beta2, g));
    _mm256_storeu_ps(mm, m1);
    _mm256_storeu_ps(pp, p1);
    StoreCopy<kCopy>(cp, p1);
  };
  TwoStateLoop<kSrc, kCopy>(io, p, m, n, vector);
}

// ---- accumulation and statistics ----

// Sum of squares in two double accumulators. The square of any finite float
// is below 2^256, so the double sum of fewer than 2^64 of them is finite: the
// sum is non-finite exactly when an input was NaN or +-Inf, which makes the
// non-finite flag free.
struct SumSquares {
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  void Add(__m256 x) {
    const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    lo = _mm256_fmadd_pd(a, a, lo);
    hi = _mm256_fmadd_pd(b, b, hi);
  }
  KernelStats Result() const {
    const __m256d s4 = _mm256_add_pd(lo, hi);
    const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
    const double s = _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
    return {s, !__builtin_isfinite(s)};
  }
};

template <SrcType kSrc, bool kOverwrite, bool kStats>
void AccumulateLoop(const void* src, float* acc, size_t n, KernelStats* stats) {
  SumSquares sum;
  const auto vector = [&](const void* s, float* a) {
    __m256 x = LoadSrc<kSrc>(s);
    if constexpr (!kOverwrite) x = _mm256_add_ps(_mm256_loadu_ps(a), x);
    _mm256_storeu_ps(a, x);
    if constexpr (kStats) sum.Add(x);  // zero padding adds 0
  };
  constexpr size_t gs = SrcSize(kSrc);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) vector(Offset(src, i * gs), acc + i);
  if (const size_t r = n - i; r > 0) {
    Scratch ss, sa;
    vector(ss.Fill(Offset(src, i * gs), r * gs), sa.FillF32(acc + i, r));
    sa.Flush(acc + i, r * 4);
  }
  if constexpr (kStats) *stats = sum.Result();
}

}  // namespace

void AdamAvx2(const AdamArgs& a, const KernelIo& io, const AdamArrays& s, size_t n) {
  const auto aligned = [](const float* x) { return reinterpret_cast<uintptr_t>(x) % 32 == 0; };
  const bool stream = s.stream && aligned(s.p_out) && aligned(s.m_out) && aligned(s.v_out);
  WithSrc(io.grad_type, [&](auto src) {
    WithCopy(io.copy_type, [&](auto copy) {
      WithBool(a.weight_decay != 0.0f, [&](auto l2) {
        WithBool(stream, [&](auto st) {
          AdamLoop<src.value, copy.value, l2.value, st.value>(a, io, s, n);
        });
      });
    });
  });
}

void AdagradAvx2(const AdagradArgs& a, const KernelIo& io, float* p, float* sum, size_t n) {
  WithSrc(io.grad_type, [&](auto src) {
    WithCopy(io.copy_type, [&](auto copy) {
      WithBool(a.weight_decay != 0.0f,
               [&](auto l2) { AdagradLoop<src.value, copy.value, l2.value>(a, io, p, sum, n); });
    });
  });
}

void LionAvx2(const LionArgs& a, const KernelIo& io, float* p, float* m, size_t n) {
  WithSrc(io.grad_type, [&](auto src) {
    WithCopy(io.copy_type, [&](auto copy) { LionLoop<src.value, copy.value>(a, io, p, m, n); });
  });
}

void AccumulateAvx2(const void* src, SrcType type, float* acc, size_t n, bool overwrite,
                    KernelStats* stats) {
  WithSrc(type, [&](auto t) {
    WithBool(overwrite, [&](auto ow) {
      WithBool(stats != nullptr,
               [&](auto st) { AccumulateLoop<t.value, ow.value, st.value>(src, acc, n, stats); });
    });
  });
}

KernelStats StatsAvx2(const void* src, SrcType type, size_t n) {
  KernelStats result{0.0, false};
  WithSrc(type, [&](auto t) {
    SumSquares sum;
    constexpr size_t gs = SrcSize(t.value);
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) sum.Add(LoadSrc<t.value>(Offset(src, i * gs)));
    if (const size_t r = n - i; r > 0) {
      Scratch ss;
      sum.Add(LoadSrc<t.value>(ss.Fill(Offset(src, i * gs), r * gs)));
    }
    result = sum.Result();
  });
  return result;
}

}  // namespace zo::offload_internal

#endif  // defined(__x86_64__)
