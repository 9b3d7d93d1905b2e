// The CUDA backend's class, shared by the files that implement it: memory
// and transfers in cuda_backend.cc, the ops that are our kernels in
// kernel_ops.cc, the GEMMs in linear.cc.
#ifndef ZO_WORKER_BACKEND_CUDA_INTERNAL_CUDA_BACKEND_IMPL_H_
#define ZO_WORKER_BACKEND_CUDA_INTERNAL_CUDA_BACKEND_IMPL_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/wake_queue.h"
#include "worker/backend/allocation_counter.h"
#include "worker/backend/backend.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/internal/cuda_sharing.h"
#include "worker/backend/cuda/internal/kernels.h"
#include "worker/backend/cuda/internal/nccl_link.h"

namespace zo::backend::cuda {

// Prints "cuda: <call> failed in <op> (<what>): <error>" and aborts: for a
// backend that cannot be built at all. Once built, a failure is recorded
// instead (CudaBackend::Fail, Backend::status()).
[[noreturn]] void CudaFatal(const char* call, const char* op, const std::string& what,
                            const std::string& error);

// Aborts via CudaFatal when `err` is not cudaSuccess; `describe()` (the
// shapes) is built only then.
template <typename Describe>
void CheckCuda(cudaError_t err, const char* call, const char* op, Describe&& describe) {
  if (err != cudaSuccess) [[unlikely]]
    CudaFatal(call, op, describe(), cudaGetErrorString(err));
}

// "cuda: <call> failed in <op> (<what>): <error>", the status a failed call
// becomes.
absl::Status CudaCallError(const char* call, const char* op, const std::string& what,
                           const std::string& error);

// Prints "<op>: <what>" and aborts: a shape mismatch is a bug in the
// calling model, as on the CPU backend.
[[noreturn]] void ShapeFatal(const char* op, const std::string& what);

// ShapeFatal(op, describe()) when `ok` is false; the message is built only then.
template <typename Describe>
void CheckShape(bool ok, const char* op, Describe&& describe) {
  if (!ok) [[unlikely]]
    ShapeFatal(op, describe());
}

// "x [4, 64] fp16", for messages.
std::string Describe(const char* name, const Tensor& t);

// A status naming the call and the op, for the methods that return one.
absl::Status CudaStatus(cudaError_t err, const char* call, const char* op);

// What outlives the backend object for as long as a tensor does: tensors
// free their memory on this stream (stream-ordered, no synchronisation).
struct DeviceContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  AllocationCounter allocated;  // Backend::allocation
  ~DeviceContext();
};

// Storage for `bytes` of device memory at `ptr` from cudaMallocAsync,
// counted in the context and freed on its compute stream when the last
// tensor lets go (stream-ordered, no synchronisation); a null `ptr` (zero
// bytes, a failed allocation) gets a placeholder, so the tensor is still
// defined.
std::shared_ptr<void> DeviceStorage(std::shared_ptr<DeviceContext> context, void* ptr,
                                    int64_t bytes);

// A tensor allocated on `stream` rather than the compute stream, so work
// queued there need not wait for the compute stream; once that work is
// synchronised, any stream may use it. RESOURCE_EXHAUSTED naming `what`
// when the device has no room.
absl::StatusOr<Tensor> AllocateOnStream(const std::shared_ptr<DeviceContext>& context,
                                        cudaStream_t stream, DType dtype, const Shape& shape,
                                        const std::string& what);

// A cached cuBLASLt plan for one GEMM shape.
struct GemmKey {
  int a_type, b_type, d_type;  // cudaDataType
  bool trans_a, trans_b;
  int64_t m, n, k;
  bool bias;
  bool accumulate;
  auto operator<=>(const GemmKey&) const = default;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const CudaBackendOptions& options, std::shared_ptr<DeviceContext> context);
  ~CudaBackend() override;

  std::string name() const override { return "cuda:" + std::to_string(context_->device); }
  absl::Status status() const override;

  Tensor Empty(DType dtype, Shape shape) override;
  Tensor Zeros(DType dtype, Shape shape) override;
  void SetZero(Tensor& t) override;
  absl::Status Upload(absl::Span<const std::byte> src, Tensor& dst) override;
  absl::Status Download(const Tensor& src, absl::Span<std::byte> dst) override;
  absl::Status UploadFloat(absl::Span<const float> src, Tensor& dst) override;
  absl::Status DownloadFloat(const Tensor& src, absl::Span<float> dst) override;
  std::shared_ptr<std::byte> AllocateHost(size_t bytes) override;
  bool UploadsFromAnyHostMemory() const override { return false; }
  bool DownloadsToAnyHostMemory() const override { return false; }
  std::optional<int64_t> FreeDeviceMemory() const override;
  std::optional<Allocation> allocation() const override;
  void ResetPeakAllocation() override;
  void DownloadAsync(const Tensor& src, absl::Span<std::byte> dst,
                     std::function<void(absl::Status)> done) override;
  void UploadAsync(absl::Span<const std::byte> src, Tensor& dst,
                   std::function<void(absl::Status)> done) override;
  std::shared_ptr<const void> QueuedWorkMark() override;
  void UploadAsyncAfter(absl::Span<const std::byte> src, Tensor& dst,
                        const std::shared_ptr<const void>& mark,
                        std::function<void(absl::Status)> done) override;
  Tensor Cast(const Tensor& src, DType dtype) override;
  void Synchronize() override;

  Tensor Linear(const Tensor& x, const Tensor& w, const Tensor& b) override;
  Tensor LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, bool want_dx,
                        Tensor& dw, Tensor* db) override;
  Tensor Embedding(absl::Span<const int32_t> tokens, int block_size, const Tensor& wte,
                   const Tensor& wpe) override;
  void EmbeddingBackward(absl::Span<const int32_t> tokens, int block_size, const Tensor& dy,
                         Tensor& dwte, Tensor& dwpe) override;
  Tensor LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                   Tensor& mean, Tensor& rstd) override;
  Tensor LayerNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                           const Tensor& rstd, const Tensor& dy, Tensor& dgamma,
                           Tensor& dbeta) override;
  Tensor Gelu(const Tensor& x) override;
  Tensor GeluBackward(const Tensor& x, const Tensor& dy) override;
  Tensor Relu(const Tensor& x) override;
  Tensor ReluBackward(const Tensor& x, const Tensor& dy) override;
  Tensor Add(const Tensor& a, const Tensor& b) override;
  void AddInto(const Tensor& x, Tensor& y) override;
  void CombineWeights(const Tensor& last, const Tensor& before, const Tensor& grad, float a,
                      float b, float c, Tensor& out) override;
  Tensor Attention(const Tensor& qkv, int batch, int heads, Tensor& lse) override;
  Tensor AttentionBackward(const Tensor& qkv, const Tensor& y, const Tensor& lse, const Tensor& dy,
                           int batch, int heads) override;
  Tensor CrossEntropy(const Tensor& logits, absl::Span<const int32_t> targets) override;
  Tensor CrossEntropyBackward(const Tensor& logits, absl::Span<const int32_t> targets,
                              float scale) override;
  DeviceSharing* sharing() override { return &sharing_; }
#ifdef ZO_HAVE_NCCL
  DeviceLinks* links() override { return NcclLinks::Available() ? &links_ : nullptr; }
#endif

 private:
  // Records `status` as the backend's failure unless one is recorded.
  void Fail(absl::Status status);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // Fail(CudaCallError(...)) when `err` is not cudaSuccess; `describe()`
  // (the shapes) is built only then.
  template <typename Describe>
  void Check(cudaError_t err, const char* call, const char* op, Describe&& describe) {
    if (err != cudaSuccess) [[unlikely]]
      Fail(CudaCallError(call, op, describe(), cudaGetErrorString(err)));
  }

  // d[m, n] (column-major, ld m) = op(a) · op(b) (+ bias[m]) (+ d when
  // accumulate), fp32 accumulation. Pointers are device memory.
  void Gemm(const char* op, cudaDataType a_type, const void* a, bool trans_a, cudaDataType b_type,
            const void* b, bool trans_b, cudaDataType d_type, void* d, int64_t m, int64_t n,
            int64_t k, const void* bias, bool accumulate);
  // n ones (at least) in `dtype`, kept for the next call: the vector the
  // bias gradient's GEMV sums rows with.
  Tensor Ones(DType dtype, int64_t n);
  // The asynchronous copies: see QueueCopy in cuda_backend.cc.
  // `after`: an event of QueuedWorkMark to wait for instead of the work
  // queued so far; null: that work.
  void QueueCopy(cudaStream_t stream, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                 const Tensor& device, std::function<void(absl::Status)> done, const char* op,
                 cudaEvent_t after = nullptr);
  // Host indices copied to the device (rows x 4 bytes), freed with the tensor.
  Tensor UploadIndices(absl::Span<const int32_t> indices, const char* op);

  CudaBackendOptions options_;
  std::shared_ptr<DeviceContext> context_;
  CudaSharing sharing_{context_};
#ifdef ZO_HAVE_NCCL
  NcclLinks links_{context_};
#endif
  // DownloadAsync's and UploadAsync's copies run on these, beside the
  // compute stream (one per direction: the two DMA engines work at once);
  // their `done` callbacks on completions_.
  cudaStream_t copy_stream_ = nullptr;
  cudaStream_t upload_stream_ = nullptr;
  std::unique_ptr<WakeQueue> completions_;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::mutex plans_mu_;
  std::map<GemmKey, cublasLtMatmulAlgo_t> plans_;  // guarded by plans_mu_
  std::mutex ones_mu_;
  Tensor ones_[3];  // by DType; guarded by ones_mu_
  std::atomic<bool> failed_{false};
  mutable std::mutex failure_mu_;
  absl::Status failure_;  // guarded by failure_mu_
};

// Runs a launch or CUDA call only while the backend has not failed (its
// tensors may then be placeholders without memory) and records its error.
#define ZO_CUDA_OP(expr, call, op, describe)          \
  do {                                                \
    if (!failed()) Check((expr), call, op, describe); \
  } while (0)

// The device pointer of a CUDA tensor, with its dtype.
inline ConstView In(const Tensor& t) { return {t.storage(), t.dtype()}; }
inline View Out(Tensor& t) { return {t.storage(), t.dtype()}; }

}  // namespace zo::backend::cuda

#endif  // ZO_WORKER_BACKEND_CUDA_INTERNAL_CUDA_BACKEND_IMPL_H_
