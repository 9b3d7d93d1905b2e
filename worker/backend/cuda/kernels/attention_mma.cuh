// The pieces the tensor-core attention kernels (attention_forward.cu,
// attention_backward.cu) share; the tile and the Layout are attention_tiling.cuh's.
//
// Flash-attention 2 style on mma.sync m16n8k16 (fp32 accumulation). Each
// warp owns 16 rows of its block's tile (queries, or keys in the dK / dV
// pass) and keeps their scores, probabilities and running outputs in
// registers: an m16n8 accumulator's layout is also the A operand layout of
// the next product, so P and dS never touch shared memory. The other side's
// 64-row tiles (keys or queries) stream through a two-stage cp.async ring;
// tiles wholly above the diagonal are skipped and only tiles that cross it
// (or the end of the sequence) pay for the mask. P and dS are rounded to the
// storage type to feed the next product, as flash-attention 2 does (in fp16
// that costs |dS| below ~6e-5 its precision: tiny gradients suffer).
// Exponentials run in base 2 with the scale folded into one multiply-add.
#ifndef ZO_WORKER_BACKEND_CUDA_KERNELS_ATTENTION_MMA_CUH_
#define ZO_WORKER_BACKEND_CUDA_KERNELS_ATTENTION_MMA_CUH_

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "common/dtype.h"
#include "worker/backend/cuda/kernels/attention_tiling.cuh"
#include "worker/backend/cuda/kernels/storage.cuh"

namespace zo::backend::cuda::attention_internal {

constexpr int kWD = 64;           // head width
constexpr int kHalfLd = kWD + 8;  // 16-bit tile row stride: 144 bytes keeps ldmatrix conflict-free
constexpr int kHalfTile = kTile * kHalfLd;  // elements of a [64][72] tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without passing through registers; when !valid
// nothing is read and the destination is zero-filled.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void CpAsync4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(SmemAddr(dst)), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most one committed group (the prefetch in flight) is pending.
__device__ __forceinline__ void CpAsyncWaitPrev() {
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

// Four 8x8 16-bit matrices; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void Ldsm4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p))
               : "memory");
}
__device__ __forceinline__ void Ldsm4T(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p))
               : "memory");
}

// c[16x8] += a[16x16] b[16x8]; fragments in the m16n8k16 register layout.
template <typename T>
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to T, `lo` in the low half (the lower column).
template <typename T>
__device__ __forceinline__ uint32_t Pack(float lo, float hi) {
  uint32_t out;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&out, &v, 4);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&out, &v, 4);
  }
  return out;
}

// A operand for k-step kk (columns 16kk .. 16kk + 15) of the 16 rows of a
// [.][72] tile starting at `rows`.
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const void* rows, int kk, int lane) {
  const int r = (lane & 7) + 8 * ((lane >> 3) & 1), col = 16 * kk + 8 * (lane >> 4);
  Ldsm4(a, static_cast<const uint16_t*>(rows) + r * kHalfLd + col);
}

// acc[16][64] = a (16 rows x 64, as 4 k-step A fragments) times the
// transpose of the 64-row tile `b` (B[k][n] = b[n][k]): rows times rows.
template <typename T>
__device__ __forceinline__ void MulRowsT(const uint32_t (&a)[4][4], const T* b, int lane,
                                         float (&acc)[8][4]) {
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t f[4];  // k-steps 2 half and 2 half + 1 of n-tile n
      Ldsm4(f, b + (8 * n + (lane & 7)) * kHalfLd + 32 * half + 8 * (lane >> 3));
      Mma<T>(acc[n], a[2 * half], f[0], f[1]);
      Mma<T>(acc[n], a[2 * half + 1], f[2], f[3]);
    }
  }
}

// acc[16][64] += p (16 x 64, fp32 accumulator layout, rounded to T here)
// times the 64-row tile `b` ([k][n] as stored).
template <typename T>
__device__ __forceinline__ void MulAccRows(const float (&p)[8][4], const T* b, int lane,
                                           float (&acc)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t a[4] = {Pack<T>(p[2 * kk][0], p[2 * kk][1]), Pack<T>(p[2 * kk][2], p[2 * kk][3]),
                           Pack<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                           Pack<T>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
    const int r = 16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t f[4];  // n-tiles 2 np and 2 np + 1
      Ldsm4T(f, b + r * kHalfLd + 16 * np + 8 * (lane >> 4));
      Mma<T>(acc[2 * np], a, f[0], f[1]);
      Mma<T>(acc[2 * np + 1], a, f[2], f[3]);
    }
  }
}

// Queues rows [0, kRows) x 64 columns (global row stride `ld`) into a
// [kRows][72] tile; rows at or past `valid` are zero-filled. Row 0 is valid.
template <int kRows, int kThreadsT, typename T>
__device__ __forceinline__ void QueueRows(const T* src, int64_t ld, int valid, T* dst) {
#pragma unroll
  for (int v = threadIdx.x; v < kRows * 8; v += kThreadsT) {
    const int r = v >> 3, col = (v & 7) * 8;
    const bool ok = r < valid;
    CpAsync16(dst + r * kHalfLd + col, ok ? src + r * ld + col : src, ok);
  }
}

// The accumulator rows of warp `warp` (scaled by `mul`) rounded to T into
// its own 16 rows of `stage` (no other warp reads them), then stored with
// 16-byte writes to `out` rows (stride `ld`) below `valid`.
template <typename T>
__device__ __forceinline__ void StoreRows(const float (&acc)[8][4], float mul0, float mul1,
                                          T* stage, T* out, int64_t ld, int valid, int lane) {
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    const int col = 8 * n + 2 * tq;
    *reinterpret_cast<uint32_t*>(stage + g * kHalfLd + col) =
        Pack<T>(acc[n][0] * mul0, acc[n][1] * mul0);
    *reinterpret_cast<uint32_t*>(stage + (g + 8) * kHalfLd + col) =
        Pack<T>(acc[n][2] * mul1, acc[n][3] * mul1);
  }
  __syncwarp();
#pragma unroll
  for (int v = lane; v < 16 * 8; v += 32) {
    const int r = v >> 3, col = (v & 7) * 8;
    if (r < valid) {
      *reinterpret_cast<uint4*>(out + r * ld + col) =
          *reinterpret_cast<const uint4*>(stage + r * kHalfLd + col);
    }
  }
}

// Warps per block of each tensor-core kernel (16 rows each). On an H200 at
// batch 16, t 1024, 12 heads, 4 everywhere beat 8 (more resident blocks).
constexpr int kFwdWarps = 4;
constexpr int kBwdQWarps = 4;
constexpr int kBwdKVWarps = 4;

// Whether the tensor-core kernels apply: head width 64, 16-bit storage, and
// 16-byte aligned rows (C is a multiple of 64, so only the bases can spoil it).
inline bool UseTensorCores(const Layout& lay, DType dtype,
                           std::initializer_list<const void*> ptrs) {
  if (lay.d != kWD || dtype == DType::kFloat32) return false;
  for (const void* p : ptrs) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

}  // namespace zo::backend::cuda::attention_internal

#endif  // ZO_WORKER_BACKEND_CUDA_KERNELS_ATTENTION_MMA_CUH_
