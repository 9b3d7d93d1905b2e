// LayerNorm over the last dimension and its backward.
//
// Forward: one block per row, two passes (mean, then the squared deviations)
// as the CPU backend does, and a third that writes y. Backward: a block
// walks rows blockIdx.x, blockIdx.x + gridDim.x, ... writing dx and summing
// its rows' dgamma/dbeta terms in shared memory; a second kernel adds the
// blocks' partial sums in block order into dgamma/dbeta.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "worker/backend/cuda/internal/kernels.h"
#include "worker/backend/cuda/kernels/block_reduce.cuh"
#include "worker/backend/cuda/kernels/packed_access.cuh"
#include "worker/backend/cuda/kernels/storage.cuh"

namespace zo::backend::cuda {
namespace {

constexpr int kThreads = 256;  // per row; a multiple of 32
// Blocks of the backward, fixed (not per device) so the partial sums, and
// with them the bits of dgamma/dbeta, do not depend on the GPU.
constexpr int64_t kBackwardBlocks = 1024;
constexpr size_t kDefaultSharedBytes = 48 * 1024;

template <int kVec, typename TX, typename TP>
__global__ void LayerNormKernel(const TX* x, const TP* gamma, const TP* beta, float eps,
                                int64_t cols, float inv_cols, TX* y, float* mean, float* rstd) {
  __shared__ float scratch[kWarp];
  const int64_t row = blockIdx.x;
  const TX* x_row = x + row * cols;
  const int64_t first = int64_t{threadIdx.x} * kVec;
  const int64_t step = int64_t{blockDim.x} * kVec;

  float sum = 0.0f;
  for (int64_t i = first; i < cols; i += step) {
    float v[kVec];
    LoadFloats<kVec>(x_row + i, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) sum += v[k];
  }
  const float m = BlockSum(sum, scratch) * inv_cols;

  float squares = 0.0f;  // two passes: no cancellation for large means
  for (int64_t i = first; i < cols; i += step) {
    float v[kVec];
    LoadFloats<kVec>(x_row + i, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float d = v[k] - m;
      squares += d * d;
    }
  }
  const float s = 1.0f / sqrtf(BlockSum(squares, scratch) * inv_cols + eps);

  TX* y_row = y + row * cols;
  for (int64_t i = first; i < cols; i += step) {
    float v[kVec], g[kVec], b[kVec];
    LoadFloats<kVec>(x_row + i, v);
    LoadFloats<kVec>(gamma + i, g);
    LoadFloats<kVec>(beta + i, b);
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = (v[k] - m) * s * g[k] + b[k];
    StoreFloats<kVec>(y_row + i, v);
  }
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// Dynamic shared memory: this block's dgamma sums [cols], dbeta sums [cols],
// then kWarp floats for BlockSum. Each thread owns the same columns in every
// row, so the sums need no synchronisation. Writes the block's sums to
// partials[blockIdx.x] ([2 * cols]: dgamma's, then dbeta's).
template <int kVec, typename TX, typename TG, typename TDy>
__global__ void LayerNormBackwardKernel(const TX* x, const TG* gamma, const float* mean,
                                        const float* rstd, const TDy* dy, int64_t rows,
                                        int64_t cols, float inv_cols, TX* dx, float* partials) {
  extern __shared__ float shared[];
  float* dgamma_sum = shared;
  float* dbeta_sum = shared + cols;
  float* scratch = shared + 2 * cols;
  const int64_t first = int64_t{threadIdx.x} * kVec;
  const int64_t step = int64_t{blockDim.x} * kVec;
  for (int64_t i = first; i < cols; i += step) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      dgamma_sum[i + k] = 0.0f;
      dbeta_sum[i + k] = 0.0f;
    }
  }

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const TX* x_row = x + row * cols;
    const TDy* dy_row = dy + row * cols;
    const float m = mean[row];
    const float s = rstd[row];
    float sum_dxhat = 0.0f;
    float sum_dxhat_xhat = 0.0f;
    for (int64_t i = first; i < cols; i += step) {
      float v[kVec], g[kVec], d[kVec];
      LoadFloats<kVec>(x_row + i, v);
      LoadFloats<kVec>(gamma + i, g);
      LoadFloats<kVec>(dy_row + i, d);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float xhat = (v[k] - m) * s;
        const float dxhat = d[k] * g[k];
        sum_dxhat += dxhat;
        sum_dxhat_xhat += dxhat * xhat;
        dgamma_sum[i + k] += d[k] * xhat;
        dbeta_sum[i + k] += d[k];
      }
    }
    const float mean_dxhat = BlockSum(sum_dxhat, scratch) * inv_cols;
    const float mean_dxhat_xhat = BlockSum(sum_dxhat_xhat, scratch) * inv_cols;

    TX* dx_row = dx + row * cols;
    for (int64_t i = first; i < cols; i += step) {
      float v[kVec], g[kVec], d[kVec];
      LoadFloats<kVec>(x_row + i, v);
      LoadFloats<kVec>(gamma + i, g);
      LoadFloats<kVec>(dy_row + i, d);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float xhat = (v[k] - m) * s;
        v[k] = s * (d[k] * g[k] - mean_dxhat - xhat * mean_dxhat_xhat);
      }
      StoreFloats<kVec>(dx_row + i, v);
    }
  }

  float* block_partials = partials + int64_t{blockIdx.x} * 2 * cols;
  for (int64_t i = first; i < cols; i += step) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      block_partials[i + k] = dgamma_sum[i + k];
      block_partials[cols + i + k] = dbeta_sum[i + k];
    }
  }
}

// Column sums of partials [blocks, 2 * cols], added into dgamma (columns
// [0, cols)) and dbeta (the rest). A block owns kColumnTile columns; its
// kPartialLanes rows of threads each sum every kPartialLanes-th partial in
// order, then one warp adds the lanes in order.
constexpr int kColumnTile = 32;
constexpr int kPartialLanes = 32;

template <typename TGa, typename TBe>
__global__ void AddPartialsKernel(const float* partials, int64_t blocks, int64_t cols, TGa* dgamma,
                                  TBe* dbeta) {
  __shared__ float lane_sums[kPartialLanes][kColumnTile];
  const int64_t width = 2 * cols;
  const int64_t col = int64_t{blockIdx.x} * kColumnTile + threadIdx.x;
  float sum = 0.0f;
  if (col < width) {
    for (int64_t b = threadIdx.y; b < blocks; b += kPartialLanes) sum += partials[b * width + col];
  }
  lane_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < width) {
    float total = 0.0f;
    for (int lane = 0; lane < kPartialLanes; ++lane) total += lane_sums[lane][threadIdx.x];
    if (col < cols) {
      dgamma[col] = FromFloat<TGa>(ToFloat(dgamma[col]) + total);
    } else {
      dbeta[col - cols] = FromFloat<TBe>(ToFloat(dbeta[col - cols]) + total);
    }
  }
}

int64_t BackwardBlocks(int64_t rows) { return std::min(rows, kBackwardBlocks); }

// The backward's dynamic shared memory: dgamma and dbeta sums, BlockSum's scratch.
size_t BackwardSharedBytes(int64_t cols) {
  return (2 * static_cast<size_t>(cols) + kWarp) * sizeof(float);
}

template <typename TX, typename TP>
void LaunchLayerNormTyped(ConstView x, ConstView gamma, ConstView beta, float eps, int64_t rows,
                          int64_t cols, View y, float* mean, float* rstd, cudaStream_t stream) {
  const float inv_cols = cols > 0 ? 1.0f / static_cast<float>(cols) : 0.0f;
  const auto* px = static_cast<const TX*>(x.data);
  const auto* pg = static_cast<const TP*>(gamma.data);
  const auto* pb = static_cast<const TP*>(beta.data);
  auto* py = static_cast<TX*>(y.data);
  const auto blocks = static_cast<unsigned>(rows);
  if (cols % kPackWidth == 0 && IsPackAligned(x.data, x.dtype) &&
      IsPackAligned(gamma.data, gamma.dtype) && IsPackAligned(beta.data, beta.dtype) &&
      IsPackAligned(y.data, y.dtype)) {
    LayerNormKernel<kPackWidth>
        <<<blocks, kThreads, 0, stream>>>(px, pg, pb, eps, cols, inv_cols, py, mean, rstd);
  } else {
    LayerNormKernel<1>
        <<<blocks, kThreads, 0, stream>>>(px, pg, pb, eps, cols, inv_cols, py, mean, rstd);
  }
}

// max_shared_bytes: 0 while the default 48 KiB suffice, else the device's
// opt-in maximum. Always that maximum, so threads launching different widths
// never lower it for each other.
template <typename TX, typename TG, typename TDy>
cudaError_t LaunchLayerNormBackwardTyped(ConstView x, ConstView gamma, const float* mean,
                                         const float* rstd, ConstView dy, int64_t rows,
                                         int64_t cols, View dx, float* partials,
                                         int max_shared_bytes, cudaStream_t stream) {
  const bool packed = cols % kPackWidth == 0 && IsPackAligned(x.data, x.dtype) &&
                      IsPackAligned(gamma.data, gamma.dtype) && IsPackAligned(dy.data, dy.dtype) &&
                      IsPackAligned(dx.data, dx.dtype);
  const auto kernel = packed ? LayerNormBackwardKernel<kPackWidth, TX, TG, TDy>
                             : LayerNormBackwardKernel<1, TX, TG, TDy>;
  if (max_shared_bytes > 0) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_shared_bytes);
    if (err != cudaSuccess) return err;
  }
  const auto blocks = static_cast<unsigned>(BackwardBlocks(rows));
  kernel<<<blocks, kThreads, BackwardSharedBytes(cols), stream>>>(
      static_cast<const TX*>(x.data), static_cast<const TG*>(gamma.data), mean, rstd,
      static_cast<const TDy*>(dy.data), rows, cols, 1.0f / static_cast<float>(cols),
      static_cast<TX*>(dx.data), partials);
  return cudaGetLastError();
}

template <typename TGa, typename TBe>
void LaunchAddPartialsTyped(const float* partials, int64_t rows, int64_t cols, View dgamma,
                            View dbeta, cudaStream_t stream) {
  const auto tiles = static_cast<unsigned>((2 * cols + kColumnTile - 1) / kColumnTile);
  const dim3 threads(kColumnTile, kPartialLanes);
  AddPartialsKernel<<<tiles, threads, 0, stream>>>(partials, BackwardBlocks(rows), cols,
                                                   static_cast<TGa*>(dgamma.data),
                                                   static_cast<TBe*>(dbeta.data));
}

}  // namespace

cudaError_t LaunchLayerNorm(ConstView x, ConstView gamma, ConstView beta, float eps, int64_t rows,
                            int64_t cols, View y, float* mean, float* rstd, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  // y takes x's dtype and beta gamma's (the callers' convention): 3 x 3 instances.
  if (y.dtype != x.dtype || beta.dtype != gamma.dtype) return cudaErrorInvalidValue;
  if (rows > INT32_MAX) return cudaErrorInvalidValue;  // one block per row
  ZO_DISPATCH_DTYPE(x.dtype, TX,
                    ZO_DISPATCH_DTYPE(gamma.dtype, TP,
                                      LaunchLayerNormTyped<TX, TP>(x, gamma, beta, eps, rows, cols,
                                                                   y, mean, rstd, stream)));
  return cudaGetLastError();
}

int64_t LayerNormBackwardScratchFloats(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  return BackwardBlocks(rows) * 2 * cols;
}

cudaError_t LaunchLayerNormBackward(ConstView x, ConstView gamma, const float* mean,
                                    const float* rstd, ConstView dy, int64_t rows, int64_t cols,
                                    View dx, View dgamma, View dbeta, float* scratch,
                                    cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  // dx takes x's dtype (the callers' convention): 3 x 3 x 3 instances.
  if (dx.dtype != x.dtype) return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  int max_shared_bytes = 0;
  if (BackwardSharedBytes(cols) > kDefaultSharedBytes) {
    int device = 0;
    err = cudaGetDevice(&device);
    if (err == cudaSuccess) {
      err = cudaDeviceGetAttribute(&max_shared_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                   device);
    }
    if (err != cudaSuccess) return err;
    // About 28k columns on an H100: far wider than any layer norm here.
    if (BackwardSharedBytes(cols) > static_cast<size_t>(max_shared_bytes)) {
      return cudaErrorInvalidValue;
    }
  }
  ZO_DISPATCH_DTYPE(
      x.dtype, TX,
      ZO_DISPATCH_DTYPE(gamma.dtype, TG,
                        ZO_DISPATCH_DTYPE(dy.dtype, TDy,
                                          err = LaunchLayerNormBackwardTyped<TX, TG, TDy>(
                                              x, gamma, mean, rstd, dy, rows, cols, dx, scratch,
                                              max_shared_bytes, stream))));
  if (err != cudaSuccess) return err;
  ZO_DISPATCH_DTYPE(dgamma.dtype, TGa,
                    ZO_DISPATCH_DTYPE(dbeta.dtype, TBe,
                                      LaunchAddPartialsTyped<TGa, TBe>(scratch, rows, cols, dgamma,
                                                                       dbeta, stream)));
  return cudaGetLastError();
}

}  // namespace zo::backend::cuda
