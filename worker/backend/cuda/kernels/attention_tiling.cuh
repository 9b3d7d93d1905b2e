// Causal self-attention, flash style: per (sequence, head) the [t, t] scores
// only ever exist as tiles in shared memory or registers. The forward keeps a
// running row max and sum (online softmax) and saves each row's log-sum-exp;
// the backward recomputes P from it. The backward is two passes so that every
// output has exactly one writer (no atomics): one over query tiles (dQ) and
// one over key tiles (dK, dV), both needing D = rowsum(dY * Y).
//
// Two implementations: a plain fp32-math one (any dtype, head width up to
// 128), and a tensor-core (mma.sync) one for head width 64 in fp16 / bf16.
//
// attention_forward.cu holds the forward kernels and LaunchAttention,
// attention_backward.cu the backward ones and LaunchAttentionBackward. What
// both sides tile the same way is here: the tile, where a head's rows sit, the
// simple kernels' rows and threads, and the checks and helpers of the
// launchers; attention_mma.cuh adds the tensor-core kernels' shared pieces.
// Only the two .cu files include it.
#ifndef ZO_WORKER_BACKEND_CUDA_KERNELS_ATTENTION_TILING_CUH_
#define ZO_WORKER_BACKEND_CUDA_KERNELS_ATTENTION_TILING_CUH_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "worker/backend/cuda/kernels/storage.cuh"

namespace zo::backend::cuda::attention_internal {

constexpr int kTile = 64;      // queries and keys per tile
constexpr int kThreads = 256;  // simple kernels: 4 threads per tile row
constexpr int kMaxHeadDim = 128;

// The simple kernels: fp32 tiles in shared memory, 4 threads per row.
// Thread (row = tid / 4, lane = tid % 4) handles tile columns lane, lane + 4, ...
// both for the 64 scores of its row and for the kMaxD / 4 output columns.

// Where one head's rows sit in qkv (part 0 = q, 1 = k, 2 = v), in y / dy, and
// in lse / delta [batch, heads, t].
struct Layout {
  int t;
  int c;
  int d;
  int heads;
  __device__ __forceinline__ int64_t QkvOffset(int b, int h, int part, int row) const {
    return (static_cast<int64_t>(b) * t + row) * (3 * static_cast<int64_t>(c)) +
           static_cast<int64_t>(part) * c + static_cast<int64_t>(h) * d;
  }
  __device__ __forceinline__ int64_t RowOffset(int b, int h, int row) const {  // y, dy
    return (static_cast<int64_t>(b) * t + row) * c + static_cast<int64_t>(h) * d;
  }
  __device__ __forceinline__ int64_t LseOffset(int b, int h, int row) const {
    return (static_cast<int64_t>(b) * heads + h) * t + row;
  }
};

// Copies kTile rows of `d` columns (row stride `ld` in global memory) into a
// float tile with row stride `sld`; rows at or past `valid` are zeros, so the
// tails contribute nothing.
template <typename T>
__device__ __forceinline__ void LoadTile(const T* src, int64_t ld, int valid, int d, float* dst,
                                         int sld) {
  for (int e = threadIdx.x; e < kTile * d; e += blockDim.x) {
    const int r = e / d, col = e % d;
    dst[r * sld + col] = r < valid ? ToFloat(src[r * ld + col]) : 0.0f;
  }
}

// ---- launch helpers ----

// Sets the dynamic shared memory limit when above the default 48 KB.
template <typename Kernel>
cudaError_t AllowSmem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

// Checks the shapes shared by forward and backward; fills `lay`.
inline bool MakeLayout(int batch, int t, int heads, int c, Layout* lay) {
  if (batch < 0 || t < 0 || heads <= 0 || c <= 0 || c % heads != 0) return false;
  // Tiles run along grid y (at most 65535); (batch, head) along x.
  if ((static_cast<int64_t>(t) + kTile - 1) / kTile > 65535) return false;
  const int d = c / heads;
  if (d > kMaxHeadDim) return false;
  *lay = Layout{t, c, d, heads};
  return true;
}

// Calls fn(std::integral_constant<int, kMaxD>) with the smallest supported
// register bucket that holds d.
template <typename Fn>
void DispatchHeadDim(int d, Fn&& fn) {
  if (d <= 32) {
    fn(std::integral_constant<int, 32>());
  } else if (d <= 64) {
    fn(std::integral_constant<int, 64>());
  } else {
    fn(std::integral_constant<int, 128>());
  }
}

}  // namespace zo::backend::cuda::attention_internal

#endif  // ZO_WORKER_BACKEND_CUDA_KERNELS_ATTENTION_TILING_CUH_
