// AVX2 + F16C conversion kernels. Compiled with -mavx2 -mfma -mf16c; see
// convert_kernels.h for what this file may include.
#include <string.h>

#include "common/internal/convert_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace zo::common_internal {
namespace {

constexpr size_t kBlock = 16;  // elements per block: two ymm of fp32

// Runs `block` over whole blocks in place and over the tail (< kBlock) through
// zero-padded stack copies, so the tail takes the same vector code path.
template <typename Src, typename Dst, typename Block>
inline void ForEachBlock(const Src* src, Dst* dst, size_t n, Block block) {
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) block(src + i, dst + i);
  if (i < n) {
    Src in[kBlock] = {};
    Dst out[kBlock];
    memcpy(in, src + i, (n - i) * sizeof(Src));
    block(in, out);
    memcpy(dst + i, out, (n - i) * sizeof(Dst));
  }
}

// fp32 bit patterns -> bf16 in the low 16 bits of each 32-bit lane, round to
// nearest even, NaN quieted; same arithmetic as FloatToBf16Bits.
inline __m256i RoundToBf16(__m256i x) {
  const __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb);
  const __m256i quiet = _mm256_or_si256(x, _mm256_set1_epi32(0x00400000));
  return _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, is_nan), 16);
}

}  // namespace

void FloatToHalfAvx2(const float* src, uint16_t* dst, size_t n) {
  ForEachBlock(src, dst, n, [](const float* s, uint16_t* d) {
    const __m128i lo = _mm256_cvtps_ph(_mm256_loadu_ps(s), _MM_FROUND_TO_NEAREST_INT);
    const __m128i hi = _mm256_cvtps_ph(_mm256_loadu_ps(s + 8), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d), lo);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 8), hi);
  });
}

void HalfToFloatAvx2(const uint16_t* src, float* dst, size_t n) {
  ForEachBlock(src, dst, n, [](const uint16_t* s, float* d) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 8));
    _mm256_storeu_ps(d, _mm256_cvtph_ps(lo));
    _mm256_storeu_ps(d + 8, _mm256_cvtph_ps(hi));
  });
}

void FloatToBf16Avx2(const float* src, uint16_t* dst, size_t n) {
  ForEachBlock(src, dst, n, [](const float* s, uint16_t* d) {
    const __m256i a = RoundToBf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
    const __m256i b = RoundToBf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 8)));
    // packus works per 128-bit lane (a0-3 b0-3 a4-7 b4-7); the permute puts
    // the quarters back in order. Lanes hold 0..0xFFFF, so no saturation.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), packed);
  });
}

void Bf16ToFloatAvx2(const uint16_t* src, float* dst, size_t n) {
  ForEachBlock(src, dst, n, [](const uint16_t* s, float* d) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 8));
    const __m256i a = _mm256_slli_epi32(_mm256_cvtepu16_epi32(lo), 16);
    const __m256i b = _mm256_slli_epi32(_mm256_cvtepu16_epi32(hi), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + 8), b);
  });
}

}  // namespace zo::common_internal

#endif  // defined(__x86_64__)
