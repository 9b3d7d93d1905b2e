// Deterministic warp and block reductions for the row kernels: butterfly
// shuffles (every lane ends with the same bits, the ops being commutative)
// and a fixed order across warps, so a sum's bits do not depend on timing.
#ifndef ZO_WORKER_BACKEND_CUDA_KERNELS_BLOCK_REDUCE_CUH_
#define ZO_WORKER_BACKEND_CUDA_KERNELS_BLOCK_REDUCE_CUH_

namespace zo::backend::cuda {

constexpr int kWarp = 32;

struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename Op>
__device__ __forceinline__ float WarpReduce(float v, Op op) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// The block's reduction, the same bits on every thread. All threads must
// call it (blockDim.x a multiple of kWarp); `scratch` holds kWarp floats and
// may be reused by the next call at once. `identity` pads the missing warps.
template <typename Op>
__device__ float BlockReduce(float v, Op op, float identity, float* scratch) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  v = WarpReduce(v, op);
  __syncthreads();  // the previous call's readers are done with scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / kWarp;
  return WarpReduce(lane < warps ? scratch[lane] : identity, op);
}

__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  return BlockReduce(v, SumOp{}, 0.0f, scratch);
}

}  // namespace zo::backend::cuda

#endif  // ZO_WORKER_BACKEND_CUDA_KERNELS_BLOCK_REDUCE_CUH_
