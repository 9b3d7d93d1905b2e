// What a worker computes with: memory and the ops of the models in
// worker/model/, behind one interface so the CPU backend (cpu/) and the CUDA
// backend (cuda/) are interchangeable.
//
// Conventions every backend follows:
//   - Activations are 2-D, [rows, features], rows = micro-batch x sequence.
//   - Ops compute in fp32 whatever the storage dtype, and round what they
//     return to that dtype (activations and their gradients take the dtype of
//     the op's main input), exactly where a GPU kernel would store fp16/bf16.
//   - Parameter gradients accumulate (+=) into tensors the caller owns,
//     normally fp32, so micro-batches sum without fp16 rounding.
//   - Indices (tokens, targets) are host arrays; a device backend copies them
//     (rows x 4 bytes).
//   - Shapes are the caller's responsibility: a mismatch is a bug in the
//     model, and the CPU backend aborts naming the op and the shapes.
//   - Work may be queued (a GPU stream); Download and Synchronize wait for it.
//     Ops may be called from several threads on distinct output tensors.
#ifndef ZO_WORKER_BACKEND_BACKEND_H_
#define ZO_WORKER_BACKEND_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "worker/backend/tensor.h"

namespace zo::backend {

class DeviceSharing;  // device_sharing.h
class DeviceLinks;    // device_link.h

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", "cuda:0".
  virtual std::string name() const = 0;

  // ---- memory ----
  // Contents unspecified.
  virtual Tensor Empty(DType dtype, Shape shape) = 0;
  virtual Tensor Zeros(DType dtype, Shape shape) = 0;
  virtual void SetZero(Tensor& t) = 0;
  // Host bytes in the tensor's storage dtype (what crosses the wire: pulled
  // weights, pushed gradients, activations between processes).
  // INVALID_ARGUMENT when the sizes differ.
  virtual absl::Status Upload(absl::Span<const std::byte> src, Tensor& dst) = 0;
  virtual absl::Status Download(const Tensor& src, absl::Span<std::byte> dst) = 0;
  // fp32 host values; Upload rounds them to dst's dtype.
  virtual absl::Status UploadFloat(absl::Span<const float> src, Tensor& dst) = 0;
  virtual absl::Status DownloadFloat(const Tensor& src, absl::Span<float> dst) = 0;
  // The first failure of an op: out of device memory, a failed launch or
  // copy. Ops return tensors, not a Status, so a backend that can fail (CUDA)
  // records it here; from then on its ops do nothing, return tensors of the
  // right shape and no meaning, and transfers return this status. Callers
  // check it between layers. The CPU backend never fails.
  virtual absl::Status status() const { return absl::OkStatus(); }
  // Bytes the device can still allocate, where that is a separate budget
  // (a GPU's memory); nullopt for host memory.
  virtual std::optional<int64_t> FreeDeviceMemory() const { return std::nullopt; }
  // Bytes of the tensors this backend made that are still alive, counted
  // at their storage dtype's size (what a device holds for them), and the
  // most at once since the last ResetPeakAllocation: what a device memory
  // budget is checked against. nullopt where the backend does not count.
  struct Allocation {
    int64_t live_bytes = 0;
    int64_t peak_bytes = 0;
  };
  virtual std::optional<Allocation> allocation() const { return std::nullopt; }
  virtual void ResetPeakAllocation() {}
  // Host memory for DownloadAsync: page-locked where the device copies into
  // it directly (CUDA), ordinary memory otherwise. Freed with the pointer.
  virtual std::shared_ptr<std::byte> AllocateHost(size_t bytes);
  // Whether UploadAsync reads any host memory at full speed; false where
  // only AllocateHost's does (CUDA: the copy engine needs page-locked
  // memory), so buffers made elsewhere are better copied into it first.
  virtual bool UploadsFromAnyHostMemory() const { return true; }
  // The same for DownloadAsync's dst.
  virtual bool DownloadsToAnyHostMemory() const { return true; }
  // Copies src's bytes (as Download) into dst once the work queued before
  // this call is done, without holding up work queued after it, then calls
  // done(status) on a thread of the backend's. dst must stay valid until
  // then; src may be dropped at once (the backend keeps it). INVALID_ARGUMENT
  // (passed to done) when the sizes differ. This default downloads at once
  // and calls done before returning.
  virtual void DownloadAsync(const Tensor& src, absl::Span<std::byte> dst,
                             std::function<void(absl::Status)> done);
  // The other direction: copies src (host bytes in dst's dtype, best from
  // AllocateHost) into dst once the work queued before this call is done
  // (so dst may be a tensor that work still reads), beside work queued
  // after it, then calls done(status) on a thread of the backend's. src and
  // dst must stay valid and dst unread until then. This default uploads at
  // once and calls done before returning.
  virtual void UploadAsync(absl::Span<const std::byte> src, Tensor& dst,
                           std::function<void(absl::Status)> done);
  // A mark of the work queued so far, for UploadAsyncAfter; null where an
  // upload never waits for queued work (this default: it copies at once).
  virtual std::shared_ptr<const void> QueuedWorkMark() { return nullptr; }
  // UploadAsync once the work queued before `mark` was made is done, not
  // the work queued before this call: uploads for the step to come, queued
  // while its first layers already compute, wait for the step before (which
  // read dst) and not for those layers. A null mark: UploadAsync.
  virtual void UploadAsyncAfter(absl::Span<const std::byte> src, Tensor& dst,
                                const std::shared_ptr<const void>& /*mark*/,
                                std::function<void(absl::Status)> done) {
    UploadAsync(src, dst, std::move(done));
  }

  // Memory another process on this host can map (device_sharing.h): what
  // stage processes on one host hand activations over with. nullptr when
  // the backend cannot share. Owned by the backend.
  virtual DeviceSharing* sharing() { return nullptr; }
  // Point-to-point links between devices of processes that cannot map each
  // other's memory (device_link.h: NCCL). nullptr when the backend has none.
  virtual DeviceLinks* links() { return nullptr; }
  // A copy of src rounded to `dtype` (fp32 -> fp16 overflows to inf, which
  // is how the servers learn of a gradient overflow).
  virtual Tensor Cast(const Tensor& src, DType dtype) = 0;
  // Waits for all queued work.
  virtual void Synchronize() = 0;

  // ---- dense ----
  // y[rows, out] = x[rows, in] · w[out, in]^T + b[out]; b may be undefined.
  virtual Tensor Linear(const Tensor& x, const Tensor& w, const Tensor& b) = 0;
  // dw += dy^T · x; *db += column sums of dy when db is not null. Returns
  // dx = dy · w in x's dtype when want_dx, else an undefined tensor.
  virtual Tensor LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, bool want_dx,
                                Tensor& dw, Tensor* db) = 0;

  // ---- embedding ----
  // y[r] = wte[tokens[r]] + wpe[r mod block_size], rows = tokens.size(), in
  // wte's dtype. Every token must be in [0, wte.dim(0)).
  virtual Tensor Embedding(absl::Span<const int32_t> tokens, int block_size, const Tensor& wte,
                           const Tensor& wpe) = 0;
  // dwte[tokens[r]] += dy[r]; dwpe[r mod block_size] += dy[r].
  virtual void EmbeddingBackward(absl::Span<const int32_t> tokens, int block_size, const Tensor& dy,
                                 Tensor& dwte, Tensor& dwpe) = 0;

  // ---- normalisation and pointwise ----
  // torch.nn.LayerNorm over the last dimension: y = (x - mean) * rstd * gamma
  // + beta, rstd = 1 / sqrt(var + eps) (biased variance). Writes the fp32
  // per-row mean and rstd ([rows]) for the backward.
  virtual Tensor LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                           Tensor& mean, Tensor& rstd) = 0;
  // Returns dx; dgamma += Σ_rows dy·x̂, dbeta += Σ_rows dy.
  virtual Tensor LayerNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                   const Tensor& rstd, const Tensor& dy, Tensor& dgamma,
                                   Tensor& dbeta) = 0;
  // torch.nn.GELU() (the erf form).
  virtual Tensor Gelu(const Tensor& x) = 0;
  virtual Tensor GeluBackward(const Tensor& x, const Tensor& dy) = 0;
  virtual Tensor Relu(const Tensor& x) = 0;
  virtual Tensor ReluBackward(const Tensor& x, const Tensor& dy) = 0;
  // a + b (the residual), in a's dtype.
  virtual Tensor Add(const Tensor& a, const Tensor& b) = 0;
  // y += x.
  virtual void AddInto(const Tensor& x, Tensor& y) = 0;
  // out = a last + b before - c grad, in fp32, rounded to out's dtype: the
  // weights a delayed step computes on (common/dpu_compensation.h). An
  // undefined `before` or `grad` leaves its term out. last, before and out
  // share a dtype; all share a shape; out may be last.
  virtual void CombineWeights(const Tensor& last, const Tensor& before, const Tensor& grad, float a,
                              float b, float c, Tensor& out) = 0;

  // ---- attention ----
  // Causal multi-head self-attention. qkv is [batch * T, 3C]: columns [0, C)
  // are the queries, [C, 2C) the keys, [2C, 3C) the values, each C split into
  // `heads` heads of C / heads consecutive columns. Per sequence and head:
  // softmax(q k^T / sqrt(C / heads)) with key positions after the query
  // masked out, times v. Returns y [batch * T, C] (heads side by side) and
  // writes each query row's log-sum-exp of its scaled scores to *lse
  // ([batch, heads, T], fp32): all the backward needs besides qkv and y, so
  // no [T, T] probabilities are kept between the passes.
  virtual Tensor Attention(const Tensor& qkv, int batch, int heads, Tensor& lse) = 0;
  // Returns dqkv [batch * T, 3C]; y is Attention's output.
  virtual Tensor AttentionBackward(const Tensor& qkv, const Tensor& y, const Tensor& lse,
                                   const Tensor& dy, int batch, int heads) = 0;

  // ---- loss ----
  // Mean over rows of -log softmax(logits[r])[targets[r]], as an fp32
  // tensor of shape {1} (downloaded when the step's loss is reported, so a
  // device backend need not wait here). Every target in [0, logits.dim(1)).
  virtual Tensor CrossEntropy(const Tensor& logits, absl::Span<const int32_t> targets) = 0;
  // The gradient of scale x that mean: scale · (softmax(logits) −
  // onehot(targets)) / rows, in logits' dtype.
  virtual Tensor CrossEntropyBackward(const Tensor& logits, absl::Span<const int32_t> targets,
                                      float scale) = 0;
};

// host[i] -> *dst[i] for every i through UploadAsync, each after the work
// queued before it; waits for all of them (the host bytes may be reused
// then) and returns the first error.
absl::Status UploadAll(Backend& backend, absl::Span<const absl::Span<const std::byte>> host,
                       absl::Span<Tensor* const> dst);

}  // namespace zo::backend

#endif  // ZO_WORKER_BACKEND_BACKEND_H_
