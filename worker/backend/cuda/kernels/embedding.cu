// Token plus position embedding and its backward.
//
// The backward needs no atomics: the host groups the rows by token, so one
// block owns each touched row of dwte and one block each row of dwpe. Each
// starts from the gradient's current value and adds its rows in increasing
// order, the CPU backend's order, so fp32 results match it bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "worker/backend/cuda/internal/kernels.h"
#include "worker/backend/cuda/kernels/packed_access.cuh"
#include "worker/backend/cuda/kernels/storage.cuh"

namespace zo::backend::cuda {
namespace {

constexpr int kThreads = 128;

// One block per row r: y[r] = wte[tokens[r]] + wpe[r % block_size].
template <int kVec, typename TE, typename TP>
__global__ void EmbeddingKernel(const int32_t* tokens, int block_size, const TE* wte, const TP* wpe,
                                int64_t cols, TE* y) {
  const int64_t row = blockIdx.x;
  const TE* token_row = wte + int64_t{tokens[row]} * cols;
  const TP* position_row = wpe + (row % block_size) * cols;
  TE* y_row = y + row * cols;
  for (int64_t i = int64_t{threadIdx.x} * kVec; i < cols; i += int64_t{blockDim.x} * kVec) {
    float t[kVec], p[kVec];
    LoadFloats<kVec>(token_row + i, t);
    LoadFloats<kVec>(position_row + i, p);
#pragma unroll
    for (int k = 0; k < kVec; ++k) t[k] += p[k];
    StoreFloats<kVec>(y_row + i, t);
  }
}

// One block per unique token u: dwte[unique_tokens[u]] += the dy rows
// row_index[row_offset[u] .. row_offset[u + 1]), in that order.
template <int kVec, typename TDy, typename TW>
__global__ void TokenGradKernel(const int32_t* unique_tokens, const int32_t* row_offset,
                                const int32_t* row_index, const TDy* dy, int64_t cols, TW* dwte) {
  const int64_t u = blockIdx.x;
  const int32_t begin = row_offset[u];
  const int32_t end = row_offset[u + 1];
  TW* grad_row = dwte + int64_t{unique_tokens[u]} * cols;
  for (int64_t i = int64_t{threadIdx.x} * kVec; i < cols; i += int64_t{blockDim.x} * kVec) {
    float acc[kVec];
    LoadFloats<kVec>(grad_row + i, acc);
    for (int32_t k = begin; k < end; ++k) {
      float g[kVec];
      LoadFloats<kVec>(dy + int64_t{row_index[k]} * cols + i, g);
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[j] += g[j];
    }
    StoreFloats<kVec>(grad_row + i, acc);
  }
}

// One block per position p: dwpe[p] += dy rows p, p + block_size, ... in order.
template <int kVec, typename TDy, typename TW>
__global__ void PositionGradKernel(const TDy* dy, int64_t rows, int block_size, int64_t cols,
                                   TW* dwpe) {
  const int64_t position = blockIdx.x;
  TW* grad_row = dwpe + position * cols;
  for (int64_t i = int64_t{threadIdx.x} * kVec; i < cols; i += int64_t{blockDim.x} * kVec) {
    float acc[kVec];
    LoadFloats<kVec>(grad_row + i, acc);
    for (int64_t r = position; r < rows; r += block_size) {
      float g[kVec];
      LoadFloats<kVec>(dy + r * cols + i, g);
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[j] += g[j];
    }
    StoreFloats<kVec>(grad_row + i, acc);
  }
}

template <typename TE, typename TP>
void LaunchEmbeddingTyped(const int32_t* tokens, int64_t rows, int block_size, ConstView wte,
                          ConstView wpe, int64_t cols, View y, cudaStream_t stream) {
  const auto* pte = static_cast<const TE*>(wte.data);
  const auto* ppe = static_cast<const TP*>(wpe.data);
  auto* py = static_cast<TE*>(y.data);
  const auto blocks = static_cast<unsigned>(rows);
  if (cols % kPackWidth == 0 && IsPackAligned(wte.data, wte.dtype) &&
      IsPackAligned(wpe.data, wpe.dtype) && IsPackAligned(y.data, y.dtype)) {
    EmbeddingKernel<kPackWidth>
        <<<blocks, kThreads, 0, stream>>>(tokens, block_size, pte, ppe, cols, py);
  } else {
    EmbeddingKernel<1><<<blocks, kThreads, 0, stream>>>(tokens, block_size, pte, ppe, cols, py);
  }
}

template <typename TDy, typename TW>
void LaunchTokenGradTyped(const int32_t* unique_tokens, const int32_t* row_offset,
                          const int32_t* row_index, int64_t unique, ConstView dy, int64_t cols,
                          View dwte, cudaStream_t stream) {
  const auto* pdy = static_cast<const TDy*>(dy.data);
  auto* pw = static_cast<TW*>(dwte.data);
  const auto blocks = static_cast<unsigned>(unique);
  if (cols % kPackWidth == 0 && IsPackAligned(dy.data, dy.dtype) &&
      IsPackAligned(dwte.data, dwte.dtype)) {
    TokenGradKernel<kPackWidth>
        <<<blocks, kThreads, 0, stream>>>(unique_tokens, row_offset, row_index, pdy, cols, pw);
  } else {
    TokenGradKernel<1>
        <<<blocks, kThreads, 0, stream>>>(unique_tokens, row_offset, row_index, pdy, cols, pw);
  }
}

// Positions at or past `rows` get no rows: they keep their value.
template <typename TDy, typename TW>
void LaunchPositionGradTyped(ConstView dy, int64_t rows, int block_size, int64_t cols, View dwpe,
                             cudaStream_t stream) {
  const auto* pdy = static_cast<const TDy*>(dy.data);
  auto* pw = static_cast<TW*>(dwpe.data);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(block_size, rows));
  if (cols % kPackWidth == 0 && IsPackAligned(dy.data, dy.dtype) &&
      IsPackAligned(dwpe.data, dwpe.dtype)) {
    PositionGradKernel<kPackWidth>
        <<<blocks, kThreads, 0, stream>>>(pdy, rows, block_size, cols, pw);
  } else {
    PositionGradKernel<1><<<blocks, kThreads, 0, stream>>>(pdy, rows, block_size, cols, pw);
  }
}

}  // namespace

cudaError_t LaunchEmbedding(const int32_t* tokens, int64_t rows, int block_size, ConstView wte,
                            ConstView wpe, int64_t cols, View y, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  // y takes wte's dtype (the callers' convention): 3 x 3 instances.
  if (y.dtype != wte.dtype || block_size <= 0) return cudaErrorInvalidValue;
  if (rows > INT32_MAX) return cudaErrorInvalidValue;  // one block per row
  ZO_DISPATCH_DTYPE(wte.dtype, TE,
                    ZO_DISPATCH_DTYPE(wpe.dtype, TP,
                                      LaunchEmbeddingTyped<TE, TP>(tokens, rows, block_size, wte,
                                                                   wpe, cols, y, stream)));
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingBackward(const int32_t* unique_tokens, const int32_t* row_offset,
                                    const int32_t* row_index, int64_t unique, int64_t rows,
                                    int block_size, ConstView dy, int64_t cols, View dwte,
                                    View dwpe, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (block_size <= 0 || unique > INT32_MAX) return cudaErrorInvalidValue;
  if (unique > 0) {
    ZO_DISPATCH_DTYPE(
        dy.dtype, TDy,
        ZO_DISPATCH_DTYPE(dwte.dtype, TW,
                          LaunchTokenGradTyped<TDy, TW>(unique_tokens, row_offset, row_index,
                                                        unique, dy, cols, dwte, stream)));
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  ZO_DISPATCH_DTYPE(dy.dtype, TDy,
                    ZO_DISPATCH_DTYPE(dwpe.dtype, TW,
                                      LaunchPositionGradTyped<TDy, TW>(dy, rows, block_size, cols,
                                                                       dwpe, stream)));
  return cudaGetLastError();
}

}  // namespace zo::backend::cuda
