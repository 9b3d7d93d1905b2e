// Causal self-attention, the backward: P recomputed from the forward's
// log-sum-exp (attention_forward.cu), in two passes so that every output has
// exactly one writer: one over query tiles (dQ) and one over key tiles (dK,
// dV), both needing D = rowsum(dY * Y). The tiling both share is
// attention_tiling.cuh's (and attention_mma.cuh's for the tensor cores).
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "worker/backend/cuda/internal/kernels.h"
#include "worker/backend/cuda/kernels/attention_mma.cuh"
#include "worker/backend/cuda/kernels/attention_tiling.cuh"
#include "worker/backend/cuda/kernels/storage.cuh"

namespace zo::backend::cuda {
namespace {

using attention_internal::AllowSmem;
using attention_internal::CpAsync4;
using attention_internal::CpAsyncCommit;
using attention_internal::CpAsyncWaitPrev;
using attention_internal::DispatchHeadDim;
using attention_internal::kBwdKVWarps;
using attention_internal::kBwdQWarps;
using attention_internal::kHalfLd;
using attention_internal::kHalfTile;
using attention_internal::kLog2e;
using attention_internal::kThreads;
using attention_internal::kTile;
using attention_internal::Layout;
using attention_internal::LoadA;
using attention_internal::LoadTile;
using attention_internal::MakeLayout;
using attention_internal::MulAccRows;
using attention_internal::MulRowsT;
using attention_internal::QueueRows;
using attention_internal::StoreRows;
using attention_internal::UseTensorCores;

// ---- simple kernels (attention_tiling.cuh: 4 threads per row) ----

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

// ---- tensor-core kernels (attention_mma.cuh) ----

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

// Shared bytes of BackwardQMma and BackwardKVMma.
constexpr size_t BackwardQMmaSmem(int warps) {
  return 2 * (2 * 16 * warps * kHalfLd + 4 * kHalfTile);
}
constexpr size_t BackwardKVMmaSmem(int warps) {
  return 2 * (2 * 16 * warps * kHalfLd) + 2 * (2 * kHalfTile * 2 + 2 * kTile * 4);
}

// The tensor-core backward for storage type T (fp16 or bf16). dQ first: it
// also forms delta, which the dK / dV pass reads.
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
