// Softmax cross-entropy over the last dimension: the mean loss and its
// gradient. One block per row: a pass for the row's max, one for the sum of
// e^(x - max) (the row is back from L2 by then), and for the backward one
// that writes the gradient.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "worker/backend/cuda/internal/kernels.h"
#include "worker/backend/cuda/kernels/block_reduce.cuh"
#include "worker/backend/cuda/kernels/packed_access.cuh"
#include "worker/backend/cuda/kernels/storage.cuh"

namespace zo::backend::cuda {
namespace {

constexpr int kThreads = 512;       // per row; a multiple of 32
constexpr int kMeanThreads = 1024;  // a power of two, for the tree

// A row's softmax: exp[i] = e^(row[i] - max), and their sum.
struct Softmax {
  float max;
  float sum;
};

template <int kVec, typename T>
__device__ Softmax RowSoftmax(const T* row, int64_t vocab, float* scratch) {
  const int64_t first = int64_t{threadIdx.x} * kVec;
  const int64_t step = int64_t{blockDim.x} * kVec;
  float max = -INFINITY;
  for (int64_t i = first; i < vocab; i += step) {
    float v[kVec];
    LoadFloats<kVec>(row + i, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) max = fmaxf(max, v[k]);
  }
  max = BlockReduce(max, MaxOp{}, -INFINITY, scratch);
  float sum = 0.0f;
  for (int64_t i = first; i < vocab; i += step) {
    float v[kVec];
    LoadFloats<kVec>(row + i, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) sum += expf(v[k] - max);
  }
  sum = BlockReduce(sum, SumOp{}, 0.0f, scratch);
  return Softmax{max, sum};
}

// row_loss[r] = log(sum) - (logits[r, target] - max).
template <int kVec, typename T>
__global__ void RowLossKernel(const T* logits, const int32_t* targets, int64_t vocab,
                              float* row_loss) {
  __shared__ float scratch[kWarp];
  const int64_t r = blockIdx.x;
  const T* row = logits + r * vocab;
  const Softmax z = RowSoftmax<kVec>(row, vocab, scratch);
  if (threadIdx.x == 0) row_loss[r] = logf(z.sum) - (ToFloat(row[targets[r]]) - z.max);
}

// loss[0] = mean of row_loss, summed in double (as the CPU backend does) in
// a fixed order: strided per thread, then a tree.
__global__ void MeanLossKernel(const float* row_loss, int64_t rows, float* loss) {
  __shared__ double partial[kMeanThreads];
  double sum = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += kMeanThreads) sum += row_loss[r];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int width = kMeanThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) loss[0] = static_cast<float>(partial[0] / static_cast<double>(rows));
}

// dlogits[r] = e^(x - max) * (row_scale / sum), less row_scale at the target.
template <int kVec, typename TL, typename TD>
__global__ void CrossEntropyBackwardKernel(const TL* logits, const int32_t* targets, int64_t vocab,
                                           float row_scale, TD* dlogits) {
  __shared__ float scratch[kWarp];
  const int64_t r = blockIdx.x;
  const TL* row = logits + r * vocab;
  const Softmax z = RowSoftmax<kVec>(row, vocab, scratch);
  const float scale_over_sum = row_scale / z.sum;
  const int64_t target = targets[r];
  TD* out = dlogits + r * vocab;
  for (int64_t i = int64_t{threadIdx.x} * kVec; i < vocab; i += int64_t{blockDim.x} * kVec) {
    float v[kVec];
    LoadFloats<kVec>(row + i, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      v[k] = expf(v[k] - z.max) * scale_over_sum;
      if (i + k == target) v[k] -= row_scale;
    }
    StoreFloats<kVec>(out + i, v);
  }
}

template <typename TL>
void LaunchRowLossTyped(ConstView logits, const int32_t* targets, int64_t rows, int64_t vocab,
                        float* row_loss, cudaStream_t stream) {
  const auto* pl = static_cast<const TL*>(logits.data);
  const auto blocks = static_cast<unsigned>(rows);
  if (vocab % kPackWidth == 0 && IsPackAligned(logits.data, logits.dtype)) {
    RowLossKernel<kPackWidth><<<blocks, kThreads, 0, stream>>>(pl, targets, vocab, row_loss);
  } else {
    RowLossKernel<1><<<blocks, kThreads, 0, stream>>>(pl, targets, vocab, row_loss);
  }
}

template <typename TL, typename TD>
void LaunchBackwardTyped(ConstView logits, const int32_t* targets, int64_t rows, int64_t vocab,
                         float row_scale, View dlogits, cudaStream_t stream) {
  const auto* pl = static_cast<const TL*>(logits.data);
  auto* pd = static_cast<TD*>(dlogits.data);
  const auto blocks = static_cast<unsigned>(rows);
  if (vocab % kPackWidth == 0 && IsPackAligned(logits.data, logits.dtype) &&
      IsPackAligned(dlogits.data, dlogits.dtype)) {
    CrossEntropyBackwardKernel<kPackWidth>
        <<<blocks, kThreads, 0, stream>>>(pl, targets, vocab, row_scale, pd);
  } else {
    CrossEntropyBackwardKernel<1>
        <<<blocks, kThreads, 0, stream>>>(pl, targets, vocab, row_scale, pd);
  }
}

}  // namespace

cudaError_t LaunchCrossEntropy(ConstView logits, const int32_t* targets, int64_t rows,
                               int64_t vocab, float* loss, float* scratch, cudaStream_t stream) {
  // The CPU backend's mean over no rows; a copy, not a kernel.
  if (rows <= 0) return cudaMemsetAsync(loss, 0, sizeof(float), stream);
  if (vocab <= 0 || rows > INT32_MAX) return cudaErrorInvalidValue;  // one block per row
  ZO_DISPATCH_DTYPE(logits.dtype, TL,
                    LaunchRowLossTyped<TL>(logits, targets, rows, vocab, scratch, stream));
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  MeanLossKernel<<<1, kMeanThreads, 0, stream>>>(scratch, rows, loss);
  return cudaGetLastError();
}

cudaError_t LaunchCrossEntropyBackward(ConstView logits, const int32_t* targets, int64_t rows,
                                       int64_t vocab, float scale, View dlogits,
                                       cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0 || rows > INT32_MAX) return cudaErrorInvalidValue;  // one block per row
  const float row_scale = scale / static_cast<float>(rows);
  ZO_DISPATCH_DTYPE(logits.dtype, TL,
                    ZO_DISPATCH_DTYPE(dlogits.dtype, TD,
                                      LaunchBackwardTyped<TL, TD>(logits, targets, rows, vocab,
                                                                  row_scale, dlogits, stream)));
  return cudaGetLastError();
}

}  // namespace zo::backend::cuda
