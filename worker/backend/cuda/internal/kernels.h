// The CUDA backend's own kernels, as host-side launchers (the .cu files in
// ../kernels/). Every launcher queues work on `stream` and returns
// cudaGetLastError() of its launch; none synchronises.
//
// Storage: a `DType` says how the bytes behind a pointer are held (fp32,
// fp16, bf16). Every kernel reads its inputs as fp32, computes in fp32 and
// rounds each output once, to nearest even, to its pointer's dtype - the
// numbers of the CPU backend (worker/backend/cpu/), which is the reference.
// All kernels are deterministic: no atomics on floats, fixed reduction
// orders, so two runs give the same bits.
#ifndef ZO_WORKER_BACKEND_CUDA_INTERNAL_KERNELS_H_
#define ZO_WORKER_BACKEND_CUDA_INTERNAL_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "common/dtype.h"

namespace zo::backend::cuda {

// A device pointer and how its elements are stored.
struct ConstView {
  const void* data;
  DType dtype;
};
struct View {
  void* data;
  DType dtype;
};

// ---- pointwise (kernels/pointwise.cu) ----
// y[i] = x[i] rounded to y's dtype (fp32 -> fp16 overflow gives inf).
cudaError_t LaunchCast(ConstView x, View y, int64_t n, cudaStream_t stream);
// y = a + b.
cudaError_t LaunchAdd(ConstView a, ConstView b, View y, int64_t n, cudaStream_t stream);
// y += x.
cudaError_t LaunchAddInto(ConstView x, View y, int64_t n, cudaStream_t stream);
// out = a last + b before - c grad (Backend::CombineWeights); before.data
// or grad.data null leaves the term out. last, before and out share a dtype.
cudaError_t LaunchCombineWeights(ConstView last, ConstView before, ConstView grad, View out,
                                 int64_t n, float a, float b, float c, cudaStream_t stream);
// torch.nn.GELU() (erf form) and its backward: dx = dy * gelu'(x).
cudaError_t LaunchGelu(ConstView x, View y, int64_t n, cudaStream_t stream);
cudaError_t LaunchGeluBackward(ConstView x, ConstView dy, View dx, int64_t n, cudaStream_t stream);
cudaError_t LaunchRelu(ConstView x, View y, int64_t n, cudaStream_t stream);
cudaError_t LaunchReluBackward(ConstView x, ConstView dy, View dx, int64_t n, cudaStream_t stream);

// ---- layer norm (kernels/layer_norm.cu) ----
// Per row of x [rows, cols]: mean, rstd = 1/sqrt(biased var + eps) (written
// as fp32 [rows]), y = (x - mean) * rstd * gamma + beta.
cudaError_t LaunchLayerNorm(ConstView x, ConstView gamma, ConstView beta, float eps, int64_t rows,
                            int64_t cols, View y, float* mean, float* rstd, cudaStream_t stream);
// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma;
// dgamma += sum_rows dy * xhat; dbeta += sum_rows dy.
// `scratch` holds at least LayerNormBackwardScratchFloats(rows, cols) floats
// (per-block partial sums, reduced in a fixed order).
int64_t LayerNormBackwardScratchFloats(int64_t rows, int64_t cols);
cudaError_t LaunchLayerNormBackward(ConstView x, ConstView gamma, const float* mean,
                                    const float* rstd, ConstView dy, int64_t rows, int64_t cols,
                                    View dx, View dgamma, View dbeta, float* scratch,
                                    cudaStream_t stream);

// ---- embedding (kernels/embedding.cu) ----
// y[r] = wte[tokens[r]] + wpe[r % block_size]; tokens on the device.
cudaError_t LaunchEmbedding(const int32_t* tokens, int64_t rows, int block_size, ConstView wte,
                            ConstView wpe, int64_t cols, View y, cudaStream_t stream);
// dwte[token] += sum of dy[r] over the rows r holding that token. The host
// groups the rows by token (it has the tokens): `unique` tokens,
// unique_tokens[u] is the u-th, and its rows are
// row_index[row_offset[u] .. row_offset[u+1]) in increasing order.
// dwpe[p] += sum of dy[r] over r % block_size == p, r in increasing order.
cudaError_t LaunchEmbeddingBackward(const int32_t* unique_tokens, const int32_t* row_offset,
                                    const int32_t* row_index, int64_t unique, int64_t rows,
                                    int block_size, ConstView dy, int64_t cols, View dwte,
                                    View dwpe, cudaStream_t stream);

// ---- loss (kernels/cross_entropy.cu) ----
// loss[0] = mean over rows of -log softmax(logits[r])[targets[r]] (fp32).
// `scratch` holds at least `rows` floats (per-row losses, summed in order).
cudaError_t LaunchCrossEntropy(ConstView logits, const int32_t* targets, int64_t rows,
                               int64_t vocab, float* loss, float* scratch, cudaStream_t stream);
// dlogits = scale * (softmax(logits) - onehot(targets)) / rows.
cudaError_t LaunchCrossEntropyBackward(ConstView logits, const int32_t* targets, int64_t rows,
                                       int64_t vocab, float scale, View dlogits,
                                       cudaStream_t stream);

// ---- attention (kernels/attention_forward.cu, kernels/attention_backward.cu) ----
// Causal multi-head self-attention over qkv [batch * t, 3c] (queries, keys,
// values side by side, each c split into `heads` heads of d = c / heads
// columns), flash-style: never materialises [t, t] scores in global memory.
// y [batch * t, c] in y's dtype; lse [batch, heads, t] fp32, the
// log-sum-exp of each query row's scaled scores (what the backward needs).
cudaError_t LaunchAttention(ConstView qkv, int batch, int t, int heads, int c, View y, float* lse,
                            cudaStream_t stream);
// dqkv [batch * t, 3c] in dqkv's dtype, from qkv, y, lse and dy [batch * t, c].
// `scratch` holds at least AttentionBackwardScratchFloats(...) floats.
int64_t AttentionBackwardScratchFloats(int batch, int t, int heads, int c);
cudaError_t LaunchAttentionBackward(ConstView qkv, ConstView y, const float* lse, ConstView dy,
                                    int batch, int t, int heads, int c, View dqkv, float* scratch,
                                    cudaStream_t stream);

}  // namespace zo::backend::cuda

#endif  // ZO_WORKER_BACKEND_CUDA_INTERNAL_KERNELS_H_
