// Packed element access for the memory-bound kernels: kPackWidth consecutive
// elements moved as one load or store (16 bytes of fp32, 8 of fp16/bf16),
// converted to and from fp32. A launcher takes the packed path only where
// IsPackAligned holds for every pointer and the row length is a multiple
// of kPackWidth.
#ifndef ZO_WORKER_BACKEND_CUDA_KERNELS_PACKED_ACCESS_CUH_
#define ZO_WORKER_BACKEND_CUDA_KERNELS_PACKED_ACCESS_CUH_

#include <cstdint>

#include "common/dtype.h"
#include "worker/backend/cuda/kernels/storage.cuh"

namespace zo::backend::cuda {

constexpr int kPackWidth = 4;

// kVec consecutive elements, moved as one access when aligned to the whole pack.
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T values[kVec];
};

template <int kVec, typename T>
__device__ __forceinline__ void LoadFloats(const T* p, float (&out)[kVec]) {
  const Pack<T, kVec> pack = *reinterpret_cast<const Pack<T, kVec>*>(p);
#pragma unroll
  for (int k = 0; k < kVec; ++k) out[k] = ToFloat(pack.values[k]);
}

template <int kVec, typename T>
__device__ __forceinline__ void StoreFloats(T* p, const float (&in)[kVec]) {
  Pack<T, kVec> pack;
#pragma unroll
  for (int k = 0; k < kVec; ++k) pack.values[k] = FromFloat<T>(in[k]);
  *reinterpret_cast<Pack<T, kVec>*>(p) = pack;
}

inline bool IsPackAligned(const void* p, DType dtype) {
  return reinterpret_cast<uintptr_t>(p) % (DTypeSize(dtype) * kPackWidth) == 0;
}

}  // namespace zo::backend::cuda

#endif  // ZO_WORKER_BACKEND_CUDA_KERNELS_PACKED_ACCESS_CUH_
