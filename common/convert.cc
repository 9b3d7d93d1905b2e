#include "common/convert.h"

#include <cassert>
#include <cstring>

#include "common/bf16.h"
#include "common/fp16.h"
#include "common/internal/convert_kernels.h"

namespace zo {
namespace {

// Element loads and stores go through memcpy: the API allows pointers that
// are not aligned to the element size, which a plain dereference would not.
template <typename T>
T LoadUnaligned(const T* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void StoreUnaligned(T* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

void FloatToHalfScalar(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) StoreUnaligned(dst + i, FloatToHalfBits(LoadUnaligned(src + i)));
}

void HalfToFloatScalar(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) StoreUnaligned(dst + i, HalfBitsToFloat(LoadUnaligned(src + i)));
}

void FloatToBf16Scalar(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) StoreUnaligned(dst + i, FloatToBf16Bits(LoadUnaligned(src + i)));
}

void Bf16ToFloatScalar(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) StoreUnaligned(dst + i, Bf16BitsToFloat(LoadUnaligned(src + i)));
}

}  // namespace

// SIMD kernels exist only on x86-64; elsewhere only kScalar is ever supported.
void FloatToHalf(const float* src, uint16_t* dst, size_t n, SimdLevel level) {
  assert(SimdLevelSupported(level));
  switch (level) {
#if defined(__x86_64__)
    case SimdLevel::kAvx2:
      return common_internal::FloatToHalfAvx2(src, dst, n);
    case SimdLevel::kAvx512:
      return common_internal::FloatToHalfAvx512(src, dst, n);
#endif
    default:
      return FloatToHalfScalar(src, dst, n);
  }
}

void HalfToFloat(const uint16_t* src, float* dst, size_t n, SimdLevel level) {
  assert(SimdLevelSupported(level));
  switch (level) {
#if defined(__x86_64__)
    case SimdLevel::kAvx2:
      return common_internal::HalfToFloatAvx2(src, dst, n);
    case SimdLevel::kAvx512:
      return common_internal::HalfToFloatAvx512(src, dst, n);
#endif
    default:
      return HalfToFloatScalar(src, dst, n);
  }
}

void FloatToBf16(const float* src, uint16_t* dst, size_t n, SimdLevel level) {
  assert(SimdLevelSupported(level));
  switch (level) {
#if defined(__x86_64__)
    case SimdLevel::kAvx2:
      return common_internal::FloatToBf16Avx2(src, dst, n);
    case SimdLevel::kAvx512:
      return common_internal::FloatToBf16Avx512(src, dst, n, HostCpuFeatures().avx512_bf16);
#endif
    default:
      return FloatToBf16Scalar(src, dst, n);
  }
}

void Bf16ToFloat(const uint16_t* src, float* dst, size_t n, SimdLevel level) {
  assert(SimdLevelSupported(level));
  switch (level) {
#if defined(__x86_64__)
    case SimdLevel::kAvx2:
      return common_internal::Bf16ToFloatAvx2(src, dst, n);
    case SimdLevel::kAvx512:
      return common_internal::Bf16ToFloatAvx512(src, dst, n);
#endif
    default:
      return Bf16ToFloatScalar(src, dst, n);
  }
}

void FloatToHalf(const float* src, uint16_t* dst, size_t n) {
  FloatToHalf(src, dst, n, ActiveSimdLevel());
}

void HalfToFloat(const uint16_t* src, float* dst, size_t n) {
  HalfToFloat(src, dst, n, ActiveSimdLevel());
}

void FloatToBf16(const float* src, uint16_t* dst, size_t n) {
  FloatToBf16(src, dst, n, ActiveSimdLevel());
}

void Bf16ToFloat(const uint16_t* src, float* dst, size_t n) {
  Bf16ToFloat(src, dst, n, ActiveSimdLevel());
}

void FloatToDType(const float* src, DType dtype, void* dst, size_t n) {
  switch (dtype) {
    case DType::kFloat16:
      FloatToHalf(src, static_cast<uint16_t*>(dst), n);
      break;
    case DType::kBFloat16:
      FloatToBf16(src, static_cast<uint16_t*>(dst), n);
      break;
    case DType::kFloat32:
      std::memcpy(dst, src, n * sizeof(float));
      break;
  }
}

}  // namespace zo
