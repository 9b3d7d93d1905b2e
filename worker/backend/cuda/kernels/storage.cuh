// Element access by storage dtype, for the kernels in this folder: every
// kernel is a template over the C++ types of its operands (float, __half,
// __nv_bfloat16), and the launcher picks the instance from the DTypes with
// ZO_DISPATCH_DTYPE.
#ifndef ZO_WORKER_BACKEND_CUDA_KERNELS_STORAGE_CUH_
#define ZO_WORKER_BACKEND_CUDA_KERNELS_STORAGE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/dtype.h"

namespace zo::backend::cuda {

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

// Round to nearest even; fp32 -> fp16 past 65504 gives inf.
template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

}  // namespace zo::backend::cuda

// Runs the statement with `TYPE` bound to the C++ type of `dtype`, e.g.
//   ZO_DISPATCH_DTYPE(x.dtype, TX, ZO_DISPATCH_DTYPE(y.dtype, TY, Kernel<TX, TY><<<...>>>(...)));
#define ZO_DISPATCH_DTYPE(dtype, TYPE, ...) \
  switch (dtype) {                          \
    case ::zo::DType::kFloat32: {           \
      using TYPE = float;                   \
      __VA_ARGS__;                          \
      break;                                \
    }                                       \
    case ::zo::DType::kFloat16: {           \
      using TYPE = __half;                  \
      __VA_ARGS__;                          \
      break;                                \
    }                                       \
    case ::zo::DType::kBFloat16: {          \
      using TYPE = __nv_bfloat16;           \
      __VA_ARGS__;                          \
      break;                                \
    }                                       \
  }

#endif  // ZO_WORKER_BACKEND_CUDA_KERNELS_STORAGE_CUH_
