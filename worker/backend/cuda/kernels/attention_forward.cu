// Causal self-attention, the forward: per query tile, the online softmax over
// the key tiles up to the diagonal; y and each row's log-sum-exp, which the
// backward (attention_backward.cu) recomputes P from. The tiling both share
// is attention_tiling.cuh's (and attention_mma.cuh's for the tensor cores).
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
using attention_internal::CpAsyncCommit;
using attention_internal::CpAsyncWaitPrev;
using attention_internal::DispatchHeadDim;
using attention_internal::kFwdWarps;
using attention_internal::kHalfLd;
using attention_internal::kHalfTile;
using attention_internal::kLn2;
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

// ---- simple kernel (attention_tiling.cuh: 4 threads per row) ----

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

// ---- tensor-core kernel (attention_mma.cuh) ----

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

// Shared bytes of ForwardMma.
constexpr size_t ForwardMmaSmem(int warps) { return 2 * (16 * warps * kHalfLd + 4 * kHalfTile); }

// The tensor-core forward for storage type T (fp16 or bf16).
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

}  // namespace zo::backend::cuda
