// Causal self-attention, flash style: per (sequence, head) the [t, t] scores
// only ever exist as tiles in shared memory or registers. The forward keeps a
// running row max and sum (online softmax) and saves each row's log-sum-exp;
// the backward recomputes P from it. The backward is two passes so that every
// output has exactly one writer (no atomics): one over query tiles (dQ) and
// one over key tiles (dK, dV), both needing D = rowsum(dY * Y).
//
// Two implementations: a plain fp32-math one (any dtype, head width up to
// 128), and a tensor-core (mma.sync) one for head width 64 in fp16 / bf16.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "worker/backend/cuda/internal/kernels.h"
#include "worker/backend/cuda/kernels/storage.cuh"

namespace zo::backend::cuda {
namespace {

constexpr int kTile = 64;      // queries and keys per tile
constexpr int kThreads = 256;  // simple kernels: 4 threads per tile row
constexpr int kMaxHeadDim = 128;

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

// ---- simple kernels: fp32 tiles in shared memory, 4 threads per row ----
// Thread (row = tid / 4, lane = tid % 4) handles tile columns lane, lane + 4, ...
// both for the 64 scores of its row and for the kMaxD / 4 output columns.

// Grid (batch * heads, query tiles). Shared: Q, K, V tiles [64][d + 1]
// (the +1 keeps the 8 rows a warp reads on distinct banks) and P [64][65].
template <typename T, int kMaxD>
__global__ void __launch_bounds__(kThreads)
    ForwardSimple(const T* __restrict__ qkv, Layout lay, float scale, T* __restrict__ y,
                  float* __restrict__ lse) {
  extern __shared__ float smem[];
  const int d = lay.d, sld = d + 1;
  float* qs = smem;
  float* ks = qs + kTile * sld;
  float* vs = ks + kTile * sld;
  float* ps = vs + kTile * sld;  // [64][65]
  const int bh = blockIdx.x, b = bh / lay.heads, h = bh % lay.heads;
  // Heaviest (last) query tiles first: the lowest block ids start first.
  const int qtile = gridDim.y - 1 - blockIdx.y;
  const int q0 = qtile * kTile;
  const int row = threadIdx.x / 4, lane = threadIdx.x % 4;
  const int i = q0 + row;  // this thread's query
  const int64_t ld = 3 * static_cast<int64_t>(lay.c);

  LoadTile(qkv + lay.QkvOffset(b, h, 0, q0), ld, lay.t - q0, d, qs, sld);
  float m = -INFINITY, l = 0.0f;
  float o[kMaxD / 4];
#pragma unroll
  for (int cc = 0; cc < kMaxD / 4; ++cc) o[cc] = 0.0f;

  for (int k0 = 0; k0 <= q0; k0 += kTile) {
    __syncthreads();  // the previous tile's K, V, P are no longer read
    LoadTile(qkv + lay.QkvOffset(b, h, 1, k0), ld, lay.t - k0, d, ks, sld);
    LoadTile(qkv + lay.QkvOffset(b, h, 2, k0), ld, lay.t - k0, d, vs, sld);
    __syncthreads();
    float s[kTile / 4];
    float tile_max = -INFINITY;
#pragma unroll
    for (int kk = 0; kk < kTile / 4; ++kk) {
      const int j = lane + 4 * kk;
      float acc = 0.0f;
      for (int e = 0; e < d; ++e) acc += qs[row * sld + e] * ks[j * sld + e];
      // Key after the query: masked (this also masks keys past t).
      s[kk] = k0 + j > i ? -INFINITY : acc * scale;
      tile_max = fmaxf(tile_max, s[kk]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    // Key k0 <= i is never masked, so m_new is finite.
    const float m_new = fmaxf(m, tile_max);
    const float alpha = expf(m - m_new);  // 0 on the first tile (m = -inf)
    float sum = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kTile / 4; ++kk) {
      const float p = expf(s[kk] - m_new);
      ps[row * (kTile + 1) + lane + 4 * kk] = p;
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    l = l * alpha + sum;
    m = m_new;
    __syncwarp();  // a row's P is written and read by the same 4 lanes
#pragma unroll
    for (int cc = 0; cc < kMaxD / 4; ++cc) {
      const int col = lane + 4 * cc;
      if (col < d) {
        float acc = 0.0f;
        for (int j = 0; j < kTile; ++j) acc += ps[row * (kTile + 1) + j] * vs[j * sld + col];
        o[cc] = o[cc] * alpha + acc;
      }
    }
  }
  if (i < lay.t) {
    const float inv = 1.0f / l;
    T* out = y + lay.RowOffset(b, h, i);
#pragma unroll
    for (int cc = 0; cc < kMaxD / 4; ++cc) {
      const int col = lane + 4 * cc;
      if (col < d) out[col] = FromFloat<T>(o[cc] * inv);
    }
    if (lane == 0) lse[lay.LseOffset(b, h, i)] = m + logf(l);
  }
}

// delta[b, h, i] = sum over the head's columns of dy * y, one thread per
// (row, head), in column order.
template <typename T>
__global__ void BackwardDelta(const T* __restrict__ y, const T* __restrict__ dy, Layout lay,
                              int64_t n, float* __restrict__ delta) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= n) return;
  // idx runs over [batch, heads, t], delta's own layout.
  const int i = static_cast<int>(idx % lay.t);
  const int64_t bh = idx / lay.t;
  const int h = static_cast<int>(bh % lay.heads), b = static_cast<int>(bh / lay.heads);
  const int64_t off = lay.RowOffset(b, h, i);
  float acc = 0.0f;
  for (int e = 0; e < lay.d; ++e) acc += ToFloat(dy[off + e]) * ToFloat(y[off + e]);
  delta[idx] = acc;
}

// Loads kTile per-row floats (lse or delta) of one head; rows past t get 0.
__device__ __forceinline__ void LoadRowStats(const float* src, int valid, float* dst) {
  for (int r = threadIdx.x; r < kTile; r += blockDim.x) dst[r] = r < valid ? src[r] : 0.0f;
}

// dK, dV for one key tile. Grid (batch * heads, key tiles). Thread (row =
// key, lane). Shared: K, V (the block's keys), Q, dY (the current query
// tile) [64][d + 1]; P^T and dS^T [64 keys][65]; lse, delta [64].
template <typename T, int kMaxD>
__global__ void __launch_bounds__(kThreads)
    BackwardKVSimple(const T* __restrict__ qkv, const T* __restrict__ dy,
                     const float* __restrict__ lse, const float* __restrict__ delta, Layout lay,
                     float scale, T* __restrict__ dqkv) {
  extern __shared__ float smem[];
  const int d = lay.d, sld = d + 1, pld = kTile + 1;
  float* ks = smem;
  float* vs = ks + kTile * sld;
  float* qs = vs + kTile * sld;
  float* dys = qs + kTile * sld;
  float* pt = dys + kTile * sld;
  float* dst = pt + kTile * pld;
  float* lse_s = dst + kTile * pld;
  float* delta_s = lse_s + kTile;
  const int bh = blockIdx.x, b = bh / lay.heads, h = bh % lay.heads;
  // The first key tiles see the most query tiles: start them first.
  const int k0 = blockIdx.y * kTile;
  const int row = threadIdx.x / 4, lane = threadIdx.x % 4;
  const int j = k0 + row;  // this thread's key
  const int64_t ld = 3 * static_cast<int64_t>(lay.c);

  LoadTile(qkv + lay.QkvOffset(b, h, 1, k0), ld, lay.t - k0, d, ks, sld);
  LoadTile(qkv + lay.QkvOffset(b, h, 2, k0), ld, lay.t - k0, d, vs, sld);
  float dk[kMaxD / 4], dv[kMaxD / 4];
#pragma unroll
  for (int cc = 0; cc < kMaxD / 4; ++cc) dk[cc] = dv[cc] = 0.0f;

  for (int q0 = k0; q0 < lay.t; q0 += kTile) {
    __syncthreads();  // the previous query tile is no longer read
    LoadTile(qkv + lay.QkvOffset(b, h, 0, q0), ld, lay.t - q0, d, qs, sld);
    LoadTile(dy + lay.RowOffset(b, h, q0), lay.c, lay.t - q0, d, dys, sld);
    LoadRowStats(lse + lay.LseOffset(b, h, q0), lay.t - q0, lse_s);
    LoadRowStats(delta + lay.LseOffset(b, h, q0), lay.t - q0, delta_s);
    __syncthreads();
#pragma unroll 4
    for (int kk = 0; kk < kTile / 4; ++kk) {
      const int qi = lane + 4 * kk;
      float s = 0.0f, dp = 0.0f;
      for (int e = 0; e < d; ++e) {
        s += qs[qi * sld + e] * ks[row * sld + e];
        dp += dys[qi * sld + e] * vs[row * sld + e];
      }
      // Masked: the key after the query, or a query past t.
      const bool live = q0 + qi >= j && q0 + qi < lay.t;
      const float p = live ? expf(s * scale - lse_s[qi]) : 0.0f;
      pt[row * pld + qi] = p;
      dst[row * pld + qi] = p * (dp - delta_s[qi]);
    }
    __syncwarp();  // a key's P^T, dS^T row is written and read by the same 4 lanes
#pragma unroll
    for (int cc = 0; cc < kMaxD / 4; ++cc) {
      const int col = lane + 4 * cc;
      if (col < d) {
        float acc_v = 0.0f, acc_k = 0.0f;
        for (int qi = 0; qi < kTile; ++qi) {
          acc_v += pt[row * pld + qi] * dys[qi * sld + col];
          acc_k += dst[row * pld + qi] * qs[qi * sld + col];
        }
        dv[cc] += acc_v;
        dk[cc] += acc_k;
      }
    }
  }
  if (j < lay.t) {
    T* out_k = dqkv + lay.QkvOffset(b, h, 1, j);
    T* out_v = dqkv + lay.QkvOffset(b, h, 2, j);
#pragma unroll
    for (int cc = 0; cc < kMaxD / 4; ++cc) {
      const int col = lane + 4 * cc;
      if (col < d) {
        out_k[col] = FromFloat<T>(dk[cc] * scale);
        out_v[col] = FromFloat<T>(dv[cc]);
      }
    }
  }
}

// dQ for one query tile. Grid (batch * heads, query tiles). Thread (row =
// query, lane). Shared: Q, dY (the block's queries), K, V (the current key
// tile) [64][d + 1]; dS [64][65].
template <typename T, int kMaxD>
__global__ void __launch_bounds__(kThreads)
    BackwardQSimple(const T* __restrict__ qkv, const T* __restrict__ dy,
                    const float* __restrict__ lse, const float* __restrict__ delta, Layout lay,
                    float scale, T* __restrict__ dqkv) {
  extern __shared__ float smem[];
  const int d = lay.d, sld = d + 1, pld = kTile + 1;
  float* qs = smem;
  float* dys = qs + kTile * sld;
  float* ks = dys + kTile * sld;
  float* vs = ks + kTile * sld;
  float* dss = vs + kTile * sld;
  const int bh = blockIdx.x, b = bh / lay.heads, h = bh % lay.heads;
  const int qtile = gridDim.y - 1 - blockIdx.y;  // heaviest first
  const int q0 = qtile * kTile;
  const int row = threadIdx.x / 4, lane = threadIdx.x % 4;
  const int i = q0 + row;  // this thread's query
  const int64_t ld = 3 * static_cast<int64_t>(lay.c);

  LoadTile(qkv + lay.QkvOffset(b, h, 0, q0), ld, lay.t - q0, d, qs, sld);
  LoadTile(dy + lay.RowOffset(b, h, q0), lay.c, lay.t - q0, d, dys, sld);
  const bool valid = i < lay.t;
  const float row_lse = valid ? lse[lay.LseOffset(b, h, i)] : 0.0f;
  const float row_delta = valid ? delta[lay.LseOffset(b, h, i)] : 0.0f;
  float dq[kMaxD / 4];
#pragma unroll
  for (int cc = 0; cc < kMaxD / 4; ++cc) dq[cc] = 0.0f;

  for (int k0 = 0; k0 <= q0; k0 += kTile) {
    __syncthreads();  // the previous key tile is no longer read
    LoadTile(qkv + lay.QkvOffset(b, h, 1, k0), ld, lay.t - k0, d, ks, sld);
    LoadTile(qkv + lay.QkvOffset(b, h, 2, k0), ld, lay.t - k0, d, vs, sld);
    __syncthreads();
#pragma unroll 4
    for (int kk = 0; kk < kTile / 4; ++kk) {
      const int kj = lane + 4 * kk;
      float s = 0.0f, dp = 0.0f;
      for (int e = 0; e < d; ++e) {
        s += qs[row * sld + e] * ks[kj * sld + e];
        dp += dys[row * sld + e] * vs[kj * sld + e];
      }
      const bool live = k0 + kj <= i && valid;
      const float p = live ? expf(s * scale - row_lse) : 0.0f;
      dss[row * pld + kj] = p * (dp - row_delta);
    }
    __syncwarp();  // a query's dS row is written and read by the same 4 lanes
#pragma unroll
    for (int cc = 0; cc < kMaxD / 4; ++cc) {
      const int col = lane + 4 * cc;
      if (col < d) {
        float acc = 0.0f;
        for (int kj = 0; kj < kTile; ++kj) acc += dss[row * pld + kj] * ks[kj * sld + col];
        dq[cc] += acc;
      }
    }
  }
  if (valid) {
    T* out = dqkv + lay.QkvOffset(b, h, 0, i);
#pragma unroll
    for (int cc = 0; cc < kMaxD / 4; ++cc) {
      const int col = lane + 4 * cc;
      if (col < d) out[col] = FromFloat<T>(dq[cc] * scale);
    }
  }
}

// ---- tensor-core kernels: head width 64, fp16 / bf16 ----
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

// Forward. Grid (batch * heads, query blocks of 16 kWarps rows). Shared: Q
// [rows][72], then two stages of K, V [64][72].
template <typename T, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, 16 / kWarps)
    ForwardMma(const T* __restrict__ qkv, Layout lay, float scale, T* __restrict__ y,
               float* __restrict__ lse) {
  constexpr int kRows = 16 * kWarps, kNT = kWarps * 32;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* qs = reinterpret_cast<T*>(smem_raw);
  T* kv = qs + kRows * kHalfLd;  // stage s: K at kv + 2 s kHalfTile, V right after
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
  const int bh = blockIdx.x, b = bh / lay.heads, h = bh % lay.heads;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kRows;  // heaviest first
  const int row0 = q0 + 16 * warp;                      // this warp's first query
  const int i0 = row0 + g, i1 = i0 + 8;                 // this lane's two queries
  const int64_t ld = 3 * static_cast<int64_t>(lay.c);
  const T* kbase = qkv + lay.QkvOffset(b, h, 1, 0);
  const T* vbase = qkv + lay.QkvOffset(b, h, 2, 0);
  const int n_tiles = (min(lay.t, q0 + kRows) + kTile - 1) / kTile;  // keys before the last query
  const float sl2 = scale * kLog2e;

  QueueRows<kRows, kNT>(qkv + lay.QkvOffset(b, h, 0, q0), ld, lay.t - q0, qs);
  QueueRows<kTile, kNT>(kbase, ld, lay.t, kv);
  QueueRows<kTile, kNT>(vbase, ld, lay.t, kv + kHalfTile);
  CpAsyncCommit();

  float o[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of raw scores
  float l[2] = {0.0f, 0.0f};            // this lane's part of the running sum

  for (int kt = 0; kt < n_tiles; ++kt) {
    if (kt + 1 < n_tiles) {
      T* next = kv + ((kt + 1) & 1) * 2 * kHalfTile;
      const int k1 = (kt + 1) * kTile;
      QueueRows<kTile, kNT>(kbase + k1 * ld, ld, lay.t - k1, next);
      QueueRows<kTile, kNT>(vbase + k1 * ld, ld, lay.t - k1, next + kHalfTile);
    }
    CpAsyncCommit();
    CpAsyncWaitPrev();
    __syncthreads();
    const int k0 = kt * kTile;
    if (k0 <= row0 + 15) {  // else every key of the tile is after every query of the warp
      const T* ks = kv + (kt & 1) * 2 * kHalfTile;
      float s[8][4];
      {
        uint32_t qf[4][4];  // reloaded per tile: holding it would spill at 128 registers
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) LoadA(qf[kk], qs + 16 * warp * kHalfLd, kk, lane);
        MulRowsT<T>(qf, ks, lane, s);
      }
      if (k0 + kTile - 1 > row0) {  // crosses the diagonal (keys past t are after it too)
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (k0 + 8 * n + 2 * tq + (e & 1) > (e < 2 ? i0 : i1)) s[n][e] = -INFINITY;
          }
        }
      }
      float mx[2] = {m[0], m[1]};
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
      }
      float alpha[2], ms[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        // Finite: key tile 0 holds a live key for every query. alpha is 0 on
        // the first tile (m = -inf).
        alpha[r] = exp2f((m[r] - mx[r]) * sl2);
        m[r] = mx[r];
        ms[r] = mx[r] * sl2;
        l[r] *= alpha[r];
      }
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[n][e] = exp2f(fmaf(s[n][e], sl2, -ms[e >> 1]));  // masked: exp2(-inf) = 0
          l[e >> 1] += s[n][e];
          o[n][e] *= alpha[e >> 1];
        }
      }
      MulAccRows<T>(s, ks + kHalfTile, lane, o);
    }
    __syncthreads();  // the next iteration refills this stage
  }
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    inv[r] = 1.0f / l[r];
  }
  if (tq == 0) {
    if (i0 < lay.t) lse[lay.LseOffset(b, h, i0)] = (m[0] * sl2 + log2f(l[0])) * kLn2;
    if (i1 < lay.t) lse[lay.LseOffset(b, h, i1)] = (m[1] * sl2 + log2f(l[1])) * kLn2;
  }
  StoreRows<T>(o, inv[0], inv[1], qs + 16 * warp * kHalfLd, y + lay.RowOffset(b, h, row0), lay.c,
               lay.t - row0, lane);
}

// dQ (and delta = rowsum(dY * Y), which the dK / dV pass reads). Grid
// (batch * heads, query blocks of 16 kWarps rows). Shared: Q, dY
// [rows][72], then two stages of K, V [64][72].
template <typename T, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    BackwardQMma(const T* __restrict__ qkv, const T* __restrict__ yv, const T* __restrict__ dy,
                 const float* __restrict__ lse, Layout lay, float scale, float* __restrict__ delta,
                 T* __restrict__ dqkv) {
  constexpr int kRows = 16 * kWarps, kNT = kWarps * 32;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* qs = reinterpret_cast<T*>(smem_raw);
  T* dys = qs + kRows * kHalfLd;
  T* kv = dys + kRows * kHalfLd;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
  const int bh = blockIdx.x, b = bh / lay.heads, h = bh % lay.heads;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kRows;  // heaviest first
  const int row0 = q0 + 16 * warp;
  const int i0 = row0 + g, i1 = i0 + 8;
  const int64_t ld = 3 * static_cast<int64_t>(lay.c);
  const T* kbase = qkv + lay.QkvOffset(b, h, 1, 0);
  const T* vbase = qkv + lay.QkvOffset(b, h, 2, 0);
  const int n_tiles = (min(lay.t, q0 + kRows) + kTile - 1) / kTile;
  const float sl2 = scale * kLog2e;

  QueueRows<kRows, kNT>(qkv + lay.QkvOffset(b, h, 0, q0), ld, lay.t - q0, qs);
  QueueRows<kRows, kNT>(dy + lay.RowOffset(b, h, q0), lay.c, lay.t - q0, dys);
  QueueRows<kTile, kNT>(kbase, ld, lay.t, kv);
  QueueRows<kTile, kNT>(vbase, ld, lay.t, kv + kHalfTile);
  CpAsyncCommit();
  // Rows past t: lse 0, delta 0; their results are never stored.
  const float lse0 = i0 < lay.t ? lse[lay.LseOffset(b, h, i0)] * kLog2e : 0.0f;
  const float lse1 = i1 < lay.t ? lse[lay.LseOffset(b, h, i1)] * kLog2e : 0.0f;

  uint32_t qf[4][4], dyf[4][4];
  float dq[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  float dl0 = 0.0f, dl1 = 0.0f;

  for (int kt = 0; kt < n_tiles; ++kt) {
    if (kt + 1 < n_tiles) {
      T* next = kv + ((kt + 1) & 1) * 2 * kHalfTile;
      const int k1 = (kt + 1) * kTile;
      QueueRows<kTile, kNT>(kbase + k1 * ld, ld, lay.t - k1, next);
      QueueRows<kTile, kNT>(vbase + k1 * ld, ld, lay.t - k1, next + kHalfTile);
    }
    CpAsyncCommit();
    CpAsyncWaitPrev();
    __syncthreads();
    if (kt == 0) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        LoadA(qf[kk], qs + 16 * warp * kHalfLd, kk, lane);
        LoadA(dyf[kk], dys + 16 * warp * kHalfLd, kk, lane);
      }
      // delta: lanes 2r, 2r + 1 sum row r's columns 0-31, 32-63, in order.
      const int r = lane >> 1, cb = (lane & 1) * 32, i = row0 + r;
      float acc = 0.0f;
      if (i < lay.t) {
        const T* yrow = yv + lay.RowOffset(b, h, i) + cb;
        const T* grow = dys + (16 * warp + r) * kHalfLd + cb;
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const uint4 yy = *reinterpret_cast<const uint4*>(yrow + 8 * v);
          const uint4 gg = *reinterpret_cast<const uint4*>(grow + 8 * v);
          const T* ye = reinterpret_cast<const T*>(&yy);
          const T* ge = reinterpret_cast<const T*>(&gg);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc += ToFloat(ge[e]) * ToFloat(ye[e]);
        }
      }
      acc += __shfl_xor_sync(0xffffffffu, acc, 1);  // same sum on both lanes
      if ((lane & 1) == 0 && i < lay.t) delta[lay.LseOffset(b, h, i)] = acc;
      dl0 = __shfl_sync(0xffffffffu, acc, 2 * g);
      dl1 = __shfl_sync(0xffffffffu, acc, 2 * (g + 8));
    }
    const int k0 = kt * kTile;
    if (k0 <= row0 + 15) {  // else the whole tile is masked for this warp
      const T* ks = kv + (kt & 1) * 2 * kHalfTile;
      const T* vs = ks + kHalfTile;
      float s[8][4], dp[8][4];
      MulRowsT<T>(qf, ks, lane, s);    // S = Q K^T
      MulRowsT<T>(dyf, vs, lane, dp);  // dP = dY V^T
      const bool diag = k0 + kTile - 1 > row0;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const bool live = !diag || k0 + 8 * n + 2 * tq + (e & 1) <= (e < 2 ? i0 : i1);
          const float p = live ? exp2f(fmaf(s[n][e], sl2, -(e < 2 ? lse0 : lse1))) : 0.0f;
          s[n][e] = p * (dp[n][e] - (e < 2 ? dl0 : dl1));  // dS
        }
      }
      MulAccRows<T>(s, ks, lane, dq);  // dQ += dS K
    }
    __syncthreads();
  }
  StoreRows<T>(dq, scale, scale, qs + 16 * warp * kHalfLd, dqkv + lay.QkvOffset(b, h, 0, row0), ld,
               lay.t - row0, lane);
}

// dK, dV. Grid (batch * heads, key blocks of 16 kWarps rows); warp w owns
// keys 16w .. 16w + 15 of the block. Shared: K, V [rows][72], then two
// stages of Q, dY [64][72] and lse, delta [64].
template <typename T, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    BackwardKVMma(const T* __restrict__ qkv, const T* __restrict__ dy,
                  const float* __restrict__ lse, const float* __restrict__ delta, Layout lay,
                  float scale, T* __restrict__ dqkv) {
  constexpr int kRows = 16 * kWarps, kNT = kWarps * 32;
  constexpr int kStage = 2 * kHalfTile * 2 + 2 * kTile * 4;  // bytes: Q, dY, lse, delta
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* ks = reinterpret_cast<T*>(smem_raw);
  T* vs = ks + kRows * kHalfLd;
  unsigned char* stages = reinterpret_cast<unsigned char*>(vs + kRows * kHalfLd);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
  const int bh = blockIdx.x, b = bh / lay.heads, h = bh % lay.heads;
  const int k0 = blockIdx.y * kRows;  // the first key blocks have the most work
  const int j0w = k0 + 16 * warp;     // this warp's first key
  const int j0 = j0w + g, j1 = j0 + 8;
  const int64_t ld = 3 * static_cast<int64_t>(lay.c);
  const T* qbase = qkv + lay.QkvOffset(b, h, 0, 0);
  const T* gbase = dy + lay.RowOffset(b, h, 0);
  const float* lbase = lse + lay.LseOffset(b, h, 0);
  const float* dbase = delta + lay.LseOffset(b, h, 0);
  const int n_tiles = (lay.t - k0 + kTile - 1) / kTile;  // query tiles from k0 on
  const float sl2 = scale * kLog2e;

  // Queues query tile q1 into stage `st`.
  auto queue = [&](int q1, int st) {
    T* qd = reinterpret_cast<T*>(stages + st * kStage);
    float* fd = reinterpret_cast<float*>(qd + 2 * kHalfTile);
    QueueRows<kTile, kNT>(qbase + q1 * ld, ld, lay.t - q1, qd);
    QueueRows<kTile, kNT>(gbase + static_cast<int64_t>(q1) * lay.c, lay.c, lay.t - q1,
                          qd + kHalfTile);
    for (int v = threadIdx.x; v < 2 * kTile; v += kNT) {
      const int r = v & (kTile - 1);
      const float* src = (v < kTile ? lbase : dbase) + q1;
      CpAsync4(fd + v, r < lay.t - q1 ? src + r : src, r < lay.t - q1);
    }
  };
  QueueRows<kRows, kNT>(qkv + lay.QkvOffset(b, h, 1, k0), ld, lay.t - k0, ks);
  QueueRows<kRows, kNT>(qkv + lay.QkvOffset(b, h, 2, k0), ld, lay.t - k0, vs);
  queue(k0, 0);
  CpAsyncCommit();

  float dk[8][4], dv[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
    dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
  }

  for (int it = 0; it < n_tiles; ++it) {
    if (it + 1 < n_tiles) queue(k0 + (it + 1) * kTile, (it + 1) & 1);
    CpAsyncCommit();
    CpAsyncWaitPrev();
    __syncthreads();
    const int q0 = k0 + it * kTile;
    if (q0 + kTile - 1 >= j0w) {  // else every query of the tile is before the warp's keys
      const T* qs = reinterpret_cast<const T*>(stages + (it & 1) * kStage);
      const T* dys = qs + kHalfTile;
      const float* lse_s = reinterpret_cast<const float*>(qs + 2 * kHalfTile);
      const float* delta_s = lse_s + kTile;
      // Masked: the query before the key, or past t.
      const bool edge = q0 < j0w + 15 || q0 + kTile > lay.t;
      float s[8][4];
      {
        uint32_t kf[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) LoadA(kf[kk], ks + 16 * warp * kHalfLd, kk, lane);
        MulRowsT<T>(kf, qs, lane, s);  // S^T = K Q^T
      }
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const float2 lq = *reinterpret_cast<const float2*>(lse_s + 8 * n + 2 * tq);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = q0 + 8 * n + 2 * tq + (e & 1);
          const bool live = !edge || (qi >= (e < 2 ? j0 : j1) && qi < lay.t);
          const float lq2 = ((e & 1) ? lq.y : lq.x) * kLog2e;
          s[n][e] = live ? exp2f(fmaf(s[n][e], sl2, -lq2)) : 0.0f;  // P^T
        }
      }
      MulAccRows<T>(s, dys, lane, dv);  // dV += P^T dY
      float dp[8][4];
      {
        uint32_t vf[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) LoadA(vf[kk], vs + 16 * warp * kHalfLd, kk, lane);
        MulRowsT<T>(vf, dys, lane, dp);  // dP^T = V dY^T
      }
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const float2 dq = *reinterpret_cast<const float2*>(delta_s + 8 * n + 2 * tq);
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] *= dp[n][e] - ((e & 1) ? dq.y : dq.x);  // dS^T
      }
      MulAccRows<T>(s, qs, lane, dk);  // dK += dS^T Q
    }
    __syncthreads();
  }
  StoreRows<T>(dk, scale, scale, ks + 16 * warp * kHalfLd, dqkv + lay.QkvOffset(b, h, 1, j0w), ld,
               lay.t - j0w, lane);
  StoreRows<T>(dv, 1.0f, 1.0f, vs + 16 * warp * kHalfLd, dqkv + lay.QkvOffset(b, h, 2, j0w), ld,
               lay.t - j0w, lane);
}

// Warps per block of each tensor-core kernel (16 rows each). On an H200 at
// batch 16, t 1024, 12 heads, 4 everywhere beat 8 (more resident blocks).
constexpr int kFwdWarps = 4;
constexpr int kBwdQWarps = 4;
constexpr int kBwdKVWarps = 4;

// Shared bytes of the tensor-core kernels.
constexpr size_t ForwardMmaSmem(int warps) { return 2 * (16 * warps * kHalfLd + 4 * kHalfTile); }
constexpr size_t BackwardQMmaSmem(int warps) {
  return 2 * (2 * 16 * warps * kHalfLd + 4 * kHalfTile);
}
constexpr size_t BackwardKVMmaSmem(int warps) {
  return 2 * (2 * 16 * warps * kHalfLd) + 2 * (2 * kHalfTile * 2 + 2 * kTile * 4);
}

// Whether the tensor-core kernels apply: head width 64, 16-bit storage, and
// 16-byte aligned rows (C is a multiple of 64, so only the bases can spoil it).
bool UseTensorCores(const Layout& lay, DType dtype, std::initializer_list<const void*> ptrs) {
  if (lay.d != kWD || dtype == DType::kFloat32) return false;
  for (const void* p : ptrs) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
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
bool MakeLayout(int batch, int t, int heads, int c, Layout* lay) {
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

// The tensor-core forward and backward for storage type T (fp16 or bf16).
template <typename T, int kWarps = kFwdWarps>
cudaError_t ForwardMmaLaunch(ConstView qkv, const Layout& lay, float scale, View y, float* lse,
                             int batch, cudaStream_t stream) {
  constexpr int kRows = 16 * kWarps;
  constexpr size_t kSmem = ForwardMmaSmem(kWarps);
  const dim3 grid(batch * lay.heads, (lay.t + kRows - 1) / kRows);
  const cudaError_t err = AllowSmem(ForwardMma<T, kWarps>, kSmem);
  if (err != cudaSuccess) return err;
  ForwardMma<T, kWarps><<<grid, kWarps * 32, kSmem, stream>>>(static_cast<const T*>(qkv.data), lay,
                                                              scale, static_cast<T*>(y.data), lse);
  return cudaGetLastError();
}

// dQ first: it also forms delta, which the dK / dV pass reads.
template <typename T, int kQWarps = kBwdQWarps, int kKVWarps = kBwdKVWarps>
cudaError_t BackwardMmaLaunch(ConstView qkv, ConstView y, const float* lse, ConstView dy,
                              const Layout& lay, float scale, View dqkv, float* scratch, int batch,
                              cudaStream_t stream) {
  constexpr int kQRows = 16 * kQWarps, kKVRows = 16 * kKVWarps;
  constexpr size_t kQSmem = BackwardQMmaSmem(kQWarps), kKVSmem = BackwardKVMmaSmem(kKVWarps);
  const dim3 grid_q(batch * lay.heads, (lay.t + kQRows - 1) / kQRows);
  const dim3 grid_kv(batch * lay.heads, (lay.t + kKVRows - 1) / kKVRows);
  const T* q = static_cast<const T*>(qkv.data);
  const T* g = static_cast<const T*>(dy.data);
  T* out = static_cast<T*>(dqkv.data);
  cudaError_t err = AllowSmem(BackwardQMma<T, kQWarps>, kQSmem);
  if (err == cudaSuccess) err = AllowSmem(BackwardKVMma<T, kKVWarps>, kKVSmem);
  if (err != cudaSuccess) return err;
  BackwardQMma<T, kQWarps><<<grid_q, kQWarps * 32, kQSmem, stream>>>(
      q, static_cast<const T*>(y.data), g, lse, lay, scale, scratch, out);
  BackwardKVMma<T, kKVWarps>
      <<<grid_kv, kKVWarps * 32, kKVSmem, stream>>>(q, g, lse, scratch, lay, scale, out);
  return cudaGetLastError();
}
}  // namespace

cudaError_t LaunchAttention(ConstView qkv, int batch, int t, int heads, int c, View y, float* lse,
                            cudaStream_t stream) {
  Layout lay;
  if (!MakeLayout(batch, t, heads, c, &lay) || qkv.dtype != y.dtype) return cudaErrorInvalidValue;
  if (static_cast<int64_t>(batch) * t == 0) return cudaSuccess;
  const float scale = 1.0f / std::sqrt(static_cast<float>(lay.d));
  const dim3 grid(batch * heads, (t + kTile - 1) / kTile);
  const size_t smem = sizeof(float) * (3 * kTile * (lay.d + 1) + kTile * (kTile + 1));
  cudaError_t err = cudaSuccess;
  if (UseTensorCores(lay, qkv.dtype, {qkv.data, y.data})) {
    return qkv.dtype == DType::kFloat16
               ? ForwardMmaLaunch<__half>(qkv, lay, scale, y, lse, batch, stream)
               : ForwardMmaLaunch<__nv_bfloat16>(qkv, lay, scale, y, lse, batch, stream);
  }
  ZO_DISPATCH_DTYPE(qkv.dtype, T, DispatchHeadDim(lay.d, [&](auto max_d) {
                      auto kernel = ForwardSimple<T, decltype(max_d)::value>;
                      err = AllowSmem(kernel, smem);
                      if (err != cudaSuccess) return;
                      kernel<<<grid, kThreads, smem, stream>>>(static_cast<const T*>(qkv.data), lay,
                                                               scale, static_cast<T*>(y.data), lse);
                    }));
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

int64_t AttentionBackwardScratchFloats(int batch, int t, int heads, int /*c*/) {
  return static_cast<int64_t>(batch) * heads * t;  // delta
}

cudaError_t LaunchAttentionBackward(ConstView qkv, ConstView y, const float* lse, ConstView dy,
                                    int batch, int t, int heads, int c, View dqkv, float* scratch,
                                    cudaStream_t stream) {
  Layout lay;
  if (!MakeLayout(batch, t, heads, c, &lay) || y.dtype != qkv.dtype || dy.dtype != qkv.dtype ||
      dqkv.dtype != qkv.dtype) {
    return cudaErrorInvalidValue;
  }
  if (static_cast<int64_t>(batch) * t == 0) return cudaSuccess;
  const float scale = 1.0f / std::sqrt(static_cast<float>(lay.d));
  const int64_t rows = static_cast<int64_t>(batch) * heads * t;
  const dim3 grid(batch * heads, (t + kTile - 1) / kTile);
  const size_t tile = kTile * (lay.d + 1), ptile = kTile * (kTile + 1);
  const size_t smem_kv = sizeof(float) * (4 * tile + 2 * ptile + 2 * kTile);
  const size_t smem_q = sizeof(float) * (4 * tile + ptile);
  cudaError_t err = cudaSuccess;
  if (UseTensorCores(lay, qkv.dtype, {qkv.data, y.data, dy.data, dqkv.data})) {
    return qkv.dtype == DType::kFloat16
               ? BackwardMmaLaunch<__half>(qkv, y, lse, dy, lay, scale, dqkv, scratch, batch,
                                           stream)
               : BackwardMmaLaunch<__nv_bfloat16>(qkv, y, lse, dy, lay, scale, dqkv, scratch, batch,
                                                  stream);
  }
  ZO_DISPATCH_DTYPE(qkv.dtype, T, DispatchHeadDim(lay.d, [&](auto max_d) {
                      constexpr int kMaxD = decltype(max_d)::value;
                      const T* q = static_cast<const T*>(qkv.data);
                      const T* g = static_cast<const T*>(dy.data);
                      T* out = static_cast<T*>(dqkv.data);
                      BackwardDelta<T>
                          <<<static_cast<unsigned>((rows + 255) / 256), 256, 0, stream>>>(
                              static_cast<const T*>(y.data), g, lay, rows, scratch);
                      auto kv = BackwardKVSimple<T, kMaxD>;
                      auto dq = BackwardQSimple<T, kMaxD>;
                      if ((err = AllowSmem(kv, smem_kv)) != cudaSuccess) return;
                      if ((err = AllowSmem(dq, smem_q)) != cudaSuccess) return;
                      kv<<<grid, kThreads, smem_kv, stream>>>(q, g, lse, scratch, lay, scale, out);
                      dq<<<grid, kThreads, smem_q, stream>>>(q, g, lse, scratch, lay, scale, out);
                    }));
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace zo::backend::cuda
