// Element-wise kernels: cast, add, GELU, ReLU and their backwards.
//
// Every element-wise op runs one grid-stride kernel that moves kPackWidth
// elements per load and store when all its pointers allow it (one 16-byte
// access for fp32, 8 bytes for fp16/bf16), and one element at a time
// otherwise.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "worker/backend/cuda/internal/kernels.h"
#include "worker/backend/cuda/kernels/packed_access.cuh"
#include "worker/backend/cuda/kernels/storage.cuh"

namespace zo::backend::cuda {
namespace {

constexpr int kThreads = 256;
// Enough threads to fill any current GPU; the grid-stride loop covers the rest.
constexpr int64_t kMaxBlocks = 4096;

int BlocksFor(int64_t threads_wanted) {
  return static_cast<int>(
      std::clamp<int64_t>((threads_wanted + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

struct Identity {
  __device__ float operator()(float v) const { return v; }
};

// x Φ(x), Φ(x) = erfc(-x / √2) / 2: erfc keeps the tail accurate for x << 0,
// where 1 + erf(x / √2) would cancel to zero.
struct Gelu {
  __device__ float operator()(float x) const {
    constexpr float kInvSqrt2 = 0.70710678118654752440f;
    return x * (0.5f * erfcf(-x * kInvSqrt2));
  }
};

// dy (Φ(x) + x φ(x)), φ(x) = e^(-x²/2) / √(2π).
struct GeluGrad {
  __device__ float operator()(float x, float dy) const {
    constexpr float kInvSqrt2 = 0.70710678118654752440f;
    constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
    const float cdf = 0.5f * erfcf(-x * kInvSqrt2);
    const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
    return dy * fmaf(x, pdf, cdf);
  }
};

// NaN gives 0, as on the CPU.
struct Relu {
  __device__ float operator()(float x) const { return x > 0.0f ? x : 0.0f; }
};

struct ReluGrad {
  __device__ float operator()(float x, float dy) const { return x > 0.0f ? dy : 0.0f; }
};

struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// y[i] = op(x[i]). Packs first; the n % kVec elements after them go to the
// first threads (kVec is at most the grid's thread count).
template <int kVec, typename Op, typename TX, typename TY>
__global__ void UnaryKernel(const TX* x, TY* y, int64_t n, Op op) {
  const int64_t thread = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t packs = n / kVec;
  for (int64_t p = thread; p < packs; p += stride) {
    float v[kVec];
    LoadFloats<kVec>(x + p * kVec, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = op(v[k]);
    StoreFloats<kVec>(y + p * kVec, v);
  }
  const int64_t tail = packs * kVec + thread;
  if (tail < n) y[tail] = FromFloat<TY>(op(ToFloat(x[tail])));
}

// y[i] = op(a[i], b[i]); y may alias a or b (each element is read before it
// is written, by the same thread), so no __restrict__.
template <int kVec, typename Op, typename TA, typename TB, typename TY>
__global__ void BinaryKernel(const TA* a, const TB* b, TY* y, int64_t n, Op op) {
  const int64_t thread = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t packs = n / kVec;
  for (int64_t p = thread; p < packs; p += stride) {
    float va[kVec], vb[kVec];
    LoadFloats<kVec>(a + p * kVec, va);
    LoadFloats<kVec>(b + p * kVec, vb);
#pragma unroll
    for (int k = 0; k < kVec; ++k) va[k] = op(va[k], vb[k]);
    StoreFloats<kVec>(y + p * kVec, va);
  }
  const int64_t tail = packs * kVec + thread;
  if (tail < n) y[tail] = FromFloat<TY>(op(ToFloat(a[tail]), ToFloat(b[tail])));
}

// Packs when every pointer allows them, else one element at a time.
template <typename TX, typename TY, typename Op>
void LaunchUnaryTyped(ConstView x, View y, int64_t n, Op op, cudaStream_t stream) {
  const auto* px = static_cast<const TX*>(x.data);
  auto* py = static_cast<TY*>(y.data);
  if (IsPackAligned(x.data, x.dtype) && IsPackAligned(y.data, y.dtype)) {
    UnaryKernel<kPackWidth><<<BlocksFor(n / kPackWidth), kThreads, 0, stream>>>(px, py, n, op);
  } else {
    UnaryKernel<1><<<BlocksFor(n), kThreads, 0, stream>>>(px, py, n, op);
  }
}

// y is in a's dtype.
template <typename TA, typename TB, typename Op>
void LaunchBinaryTyped(ConstView a, ConstView b, View y, int64_t n, Op op, cudaStream_t stream) {
  const auto* pa = static_cast<const TA*>(a.data);
  const auto* pb = static_cast<const TB*>(b.data);
  auto* py = static_cast<TA*>(y.data);
  if (IsPackAligned(a.data, a.dtype) && IsPackAligned(b.data, b.dtype) &&
      IsPackAligned(y.data, y.dtype)) {
    BinaryKernel<kPackWidth><<<BlocksFor(n / kPackWidth), kThreads, 0, stream>>>(pa, pb, py, n, op);
  } else {
    BinaryKernel<1><<<BlocksFor(n), kThreads, 0, stream>>>(pa, pb, py, n, op);
  }
}

template <typename Op>
cudaError_t LaunchUnary(ConstView x, View y, int64_t n, Op op, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ZO_DISPATCH_DTYPE(x.dtype, TX,
                    ZO_DISPATCH_DTYPE(y.dtype, TY, LaunchUnaryTyped<TX, TY>(x, y, n, op, stream)));
  return cudaGetLastError();
}

// y takes a's dtype (the callers' convention), which keeps the instances at
// 3 x 3 per op.
template <typename Op>
cudaError_t LaunchBinary(ConstView a, ConstView b, View y, int64_t n, Op op, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (y.dtype != a.dtype) return cudaErrorInvalidValue;
  ZO_DISPATCH_DTYPE(
      a.dtype, TA,
      ZO_DISPATCH_DTYPE(b.dtype, TB, LaunchBinaryTyped<TA, TB>(a, b, y, n, op, stream)));
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchCast(ConstView x, View y, int64_t n, cudaStream_t stream) {
  return LaunchUnary(x, y, n, Identity{}, stream);
}

cudaError_t LaunchAdd(ConstView a, ConstView b, View y, int64_t n, cudaStream_t stream) {
  return LaunchBinary(a, b, y, n, Sum{}, stream);
}

cudaError_t LaunchAddInto(ConstView x, View y, int64_t n, cudaStream_t stream) {
  return LaunchBinary(ConstView{y.data, y.dtype}, x, y, n, Sum{}, stream);
}

namespace {

template <typename TW, typename TG>
__global__ void CombineWeightsKernel(const TW* last, const TW* before, const TG* grad, TW* out,
                                     int64_t n, float a, float b, float c) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    float w = a * ToFloat(last[i]);
    if (before != nullptr) w = fmaf(b, ToFloat(before[i]), w);
    if (grad != nullptr) w = fmaf(-c, ToFloat(grad[i]), w);
    out[i] = FromFloat<TW>(w);
  }
}

}  // namespace

cudaError_t LaunchCombineWeights(ConstView last, ConstView before, ConstView grad, View out,
                                 int64_t n, float a, float b, float c, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (out.dtype != last.dtype || (before.data != nullptr && before.dtype != last.dtype)) {
    return cudaErrorInvalidValue;
  }
  const DType grad_dtype = grad.data != nullptr ? grad.dtype : last.dtype;
  ZO_DISPATCH_DTYPE(
      last.dtype, TW,
      ZO_DISPATCH_DTYPE(
          grad_dtype, TG,
          (CombineWeightsKernel<TW, TG><<<BlocksFor(n), kThreads, 0, stream>>>(
              static_cast<const TW*>(last.data), static_cast<const TW*>(before.data),
              static_cast<const TG*>(grad.data), static_cast<TW*>(out.data), n, a, b, c))));
  return cudaGetLastError();
}

cudaError_t LaunchGelu(ConstView x, View y, int64_t n, cudaStream_t stream) {
  return LaunchUnary(x, y, n, Gelu{}, stream);
}

cudaError_t LaunchGeluBackward(ConstView x, ConstView dy, View dx, int64_t n, cudaStream_t stream) {
  return LaunchBinary(x, dy, dx, n, GeluGrad{}, stream);
}

cudaError_t LaunchRelu(ConstView x, View y, int64_t n, cudaStream_t stream) {
  return LaunchUnary(x, y, n, Relu{}, stream);
}

cudaError_t LaunchReluBackward(ConstView x, ConstView dy, View dx, int64_t n, cudaStream_t stream) {
  return LaunchBinary(x, dy, dx, n, ReluGrad{}, stream);
}

}  // namespace zo::backend::cuda
