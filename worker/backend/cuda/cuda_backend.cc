// The CUDA backend's memory, transfers and lifetime; the ops that are the
// project's own kernels are in kernel_ops.cc, the GEMMs in linear.cc.
//
// Memory comes from the device's stream-ordered pool (cudaMallocAsync) with
// no release threshold, so a step's tensors are recycled without returning
// to the driver, and a tensor freed on the backend's stream is reusable by
// the next op without any host synchronisation.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/units.h"
#include "worker/backend/cuda/internal/cuda_backend_impl.h"

namespace zo::backend {

int CudaDeviceCount(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why != nullptr) *why = absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorString(err));
    cudaGetLastError();  // not sticky: leave no error for the next call
    return 0;
  }
  if (n == 0 && why != nullptr) *why = "cudaGetDeviceCount found no device";
  return n;
}

int64_t CudaMemoryInUse(int device) {
  int current = 0;
  size_t free = 0, total = 0;
  if (cudaGetDevice(&current) != cudaSuccess || cudaSetDevice(device) != cudaSuccess ||
      cudaMemGetInfo(&free, &total) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  cudaSetDevice(current);
  return static_cast<int64_t>(total - free);
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options) {
  std::string why;
  const int count = CudaDeviceCount(&why);
  if (count == 0) return absl::FailedPreconditionError(absl::StrCat("no CUDA device (", why, ")"));
  if (options.device < 0 || options.device >= count) {
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device ", options.device,
                                                      ": this machine has ", count, " (0 to ",
                                                      count - 1, ")"));
  }
  auto context = std::make_shared<cuda::DeviceContext>();
  context->device = options.device;
  if (cudaError_t err = cudaSetDevice(options.device); err != cudaSuccess) {
    return cuda::CudaStatus(err, "cudaSetDevice", "MakeCudaBackend");
  }
  if (cudaError_t err = cudaStreamCreateWithFlags(&context->stream, cudaStreamNonBlocking);
      err != cudaSuccess) {
    return cuda::CudaStatus(err, "cudaStreamCreateWithFlags", "MakeCudaBackend");
  }
  // Keep freed blocks in the pool: a training step frees and allocates the
  // same sizes every step, and returning them to the driver would sync.
  cudaMemPool_t pool;
  if (cudaError_t err = cudaDeviceGetDefaultMemPool(&pool, options.device); err == cudaSuccess) {
    uint64_t threshold = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  }
  return std::make_unique<cuda::CudaBackend>(options, std::move(context));
}

namespace cuda {

void ShapeFatal(const char* op, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", op, what.c_str());
  std::fflush(stderr);
  std::abort();
}

std::string Describe(const char* name, const Tensor& t) {
  return absl::StrCat(name, " ", ShapeString(t.shape()), " ", std::string(DTypeName(t.dtype())));
}

absl::Status CudaCallError(const char* call, const char* op, const std::string& what,
                           const std::string& error) {
  return absl::InternalError(
      absl::StrCat("cuda: ", call, " failed in ", op, " (", what, "): ", error));
}

void CudaFatal(const char* call, const char* op, const std::string& what,
               const std::string& error) {
  std::fprintf(stderr, "cuda: %s failed in %s (%s): %s\n", call, op, what.c_str(), error.c_str());
  std::fflush(stderr);
  std::abort();
}

absl::Status CudaStatus(cudaError_t err, const char* call, const char* op) {
  return absl::InternalError(
      absl::StrCat("cuda: ", call, " failed in ", op, ": ", cudaGetErrorString(err)));
}

std::shared_ptr<void> DeviceStorage(std::shared_ptr<DeviceContext> context, void* ptr,
                                    int64_t bytes) {
  if (ptr == nullptr) {
    auto placeholder = std::make_shared<char>(0);
    return std::shared_ptr<void>(placeholder, placeholder.get());
  }
  context->allocated.Allocated(bytes);
  // The deleter holds the context: the stream outlives every tensor.
  return std::shared_ptr<void>(ptr, [context = std::move(context), bytes](void* p) {
    cudaFreeAsync(p, context->stream);
    context->allocated.Freed(bytes);
  });
}

absl::StatusOr<Tensor> AllocateOnStream(const std::shared_ptr<DeviceContext>& context,
                                        cudaStream_t stream, DType dtype, const Shape& shape,
                                        const std::string& what) {
  const int64_t bytes = NumElements(shape) * static_cast<int64_t>(DTypeSize(dtype));
  void* ptr = nullptr;
  if (bytes > 0) {
    if (cudaError_t err = cudaMallocAsync(&ptr, static_cast<size_t>(bytes), stream);
        err != cudaSuccess) {
      cudaGetLastError();  // not sticky: the device goes on working
      return absl::ResourceExhaustedError(
          absl::StrCat("cuda: out of memory on cuda:", context->device, " for ", what, " (", bytes,
                       " bytes): ", cudaGetErrorString(err)));
    }
  }
  return Tensor(dtype, shape, DeviceStorage(context, ptr, bytes));
}

DeviceContext::~DeviceContext() {
  if (stream != nullptr) {
    cudaSetDevice(device);
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
}

namespace {

absl::Span<const std::byte> Bytes(absl::Span<const float> v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(float)};
}
absl::Span<std::byte> WritableBytes(absl::Span<float> v) {
  return {reinterpret_cast<std::byte*>(v.data()), v.size() * sizeof(float)};
}

}  // namespace

// ---------------------------------------------------------------- lifetime

namespace {
constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS's advice for Hopper
}  // namespace

CudaBackend::CudaBackend(const CudaBackendOptions& options, std::shared_ptr<DeviceContext> context)
    : options_(options), context_(std::move(context)) {
  if (cublasStatus_t s = cublasLtCreate(&lt_); s != CUBLAS_STATUS_SUCCESS) [[unlikely]]
    CudaFatal("cublasLtCreate", "CudaBackend", name(), cublasLtGetStatusString(s));
  workspace_bytes_ = kWorkspaceBytes;
  CheckCuda(cudaMalloc(&workspace_, workspace_bytes_), "cudaMalloc", "CudaBackend",
            [&] { return absl::StrCat("cuBLASLt workspace of ", workspace_bytes_, " bytes"); });
  CheckCuda(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking),
            "cudaStreamCreateWithFlags", "CudaBackend", [] { return std::string("copy stream"); });
  CheckCuda(cudaStreamCreateWithFlags(&upload_stream_, cudaStreamNonBlocking),
            "cudaStreamCreateWithFlags", "CudaBackend",
            [] { return std::string("upload stream"); });
  completions_ = std::make_unique<WakeQueue>();
}

CudaBackend::~CudaBackend() {
  // Host functions still queued run (and post) before the stream goes; the
  // callback thread then runs every `done` before it joins.
  cudaStreamSynchronize(copy_stream_);
  cudaStreamSynchronize(upload_stream_);
  completions_.reset();
  cudaStreamDestroy(copy_stream_);
  cudaStreamDestroy(upload_stream_);
  cudaStreamSynchronize(context_->stream);
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (lt_ != nullptr) cublasLtDestroy(lt_);
}

// ---------------------------------------------------------------- memory

void CudaBackend::Fail(absl::Status status) {
  std::lock_guard<std::mutex> lock(failure_mu_);
  if (!failure_.ok()) return;
  failure_ = std::move(status);
  failed_.store(true, std::memory_order_release);
}

absl::Status CudaBackend::status() const {
  if (!failed()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(failure_mu_);
  return failure_;
}

Tensor CudaBackend::Empty(DType dtype, Shape shape) {
  const int64_t n = NumElements(shape);
  const size_t bytes = static_cast<size_t>(n) * DTypeSize(dtype);
  void* ptr = nullptr;
  if (bytes > 0 && !failed()) {
    const cudaError_t err = cudaMallocAsync(&ptr, bytes, context_->stream);
    if (err != cudaSuccess) [[unlikely]] {
      size_t free_bytes = 0, total_bytes = 0;
      cudaGetLastError();  // not sticky: the device goes on working
      cudaMemGetInfo(&free_bytes, &total_bytes);
      Fail(absl::ResourceExhaustedError(
          absl::StrCat("cuda: out of memory on ", name(), ": ", ShapeString(shape), " ",
                       std::string(DTypeName(dtype)), " needs ", bytes, " bytes (",
                       FormatBytes(bytes), "), ", FormatBytes(free_bytes), " free of ",
                       FormatBytes(total_bytes), " (", cudaGetErrorString(err), ")")));
      ptr = nullptr;
    }
  }
  return Tensor(dtype, std::move(shape), DeviceStorage(context_, ptr, static_cast<int64_t>(bytes)));
}

Tensor CudaBackend::Zeros(DType dtype, Shape shape) {
  Tensor t = Empty(dtype, std::move(shape));
  SetZero(t);
  return t;
}

void CudaBackend::SetZero(Tensor& t) {
  if (t.nbytes() == 0) return;
  // All-zero bits are +0 in fp32, fp16 and bf16.
  ZO_CUDA_OP(cudaMemsetAsync(t.storage(), 0, t.nbytes(), context_->stream), "cudaMemsetAsync",
             "SetZero", [&] { return Describe("t", t); });
}

absl::Status CudaBackend::Upload(absl::Span<const std::byte> src, Tensor& dst) {
  if (static_cast<int64_t>(src.size()) != dst.nbytes()) {
    return absl::InvalidArgumentError(absl::StrCat("Upload: ", src.size(), " bytes for tensor ",
                                                   ShapeString(dst.shape()), " of ", dst.nbytes(),
                                                   " bytes"));
  }
  if (failed()) return status();
  if (src.empty()) return absl::OkStatus();
  // From pageable memory the copy has read `src` when the call returns.
  if (cudaError_t err = cudaMemcpyAsync(dst.storage(), src.data(), src.size(),
                                        cudaMemcpyHostToDevice, context_->stream);
      err != cudaSuccess) {
    return CudaStatus(err, "cudaMemcpyAsync", "Upload");
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Download(const Tensor& src, absl::Span<std::byte> dst) {
  if (static_cast<int64_t>(dst.size()) != src.nbytes()) {
    return absl::InvalidArgumentError(absl::StrCat("Download: ", dst.size(), " bytes for tensor ",
                                                   ShapeString(src.shape()), " of ", src.nbytes(),
                                                   " bytes"));
  }
  if (failed()) return status();
  if (dst.empty()) return absl::OkStatus();
  if (cudaError_t err = cudaMemcpyAsync(dst.data(), src.storage(), dst.size(),
                                        cudaMemcpyDeviceToHost, context_->stream);
      err != cudaSuccess) {
    return CudaStatus(err, "cudaMemcpyAsync", "Download");
  }
  if (cudaError_t err = cudaStreamSynchronize(context_->stream); err != cudaSuccess) {
    return CudaStatus(err, "cudaStreamSynchronize", "Download");
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::UploadFloat(absl::Span<const float> src, Tensor& dst) {
  if (static_cast<int64_t>(src.size()) != dst.numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("UploadFloat: ", src.size(), " values for tensor ", ShapeString(dst.shape())));
  }
  if (failed()) return status();
  if (dst.dtype() == DType::kFloat32) return Upload(Bytes(src), dst);
  Tensor staged = Empty(DType::kFloat32, dst.shape());
  if (absl::Status s = Upload(Bytes(src), staged); !s.ok()) return s;
  if (cudaError_t err = LaunchCast(In(staged), Out(dst), dst.numel(), context_->stream);
      err != cudaSuccess) {
    return CudaStatus(err, "LaunchCast", "UploadFloat");
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::DownloadFloat(const Tensor& src, absl::Span<float> dst) {
  if (static_cast<int64_t>(dst.size()) != src.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DownloadFloat: ", dst.size(), " values for tensor ", ShapeString(src.shape())));
  }
  if (src.dtype() == DType::kFloat32) return Download(src, WritableBytes(dst));
  return Download(Cast(src, DType::kFloat32), WritableBytes(dst));
}

std::optional<int64_t> CudaBackend::FreeDeviceMemory() const {
  size_t free = 0, total = 0;
  if (cudaSetDevice(context_->device) != cudaSuccess ||
      cudaMemGetInfo(&free, &total) != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  return static_cast<int64_t>(free);
}

std::optional<Backend::Allocation> CudaBackend::allocation() const {
  return context_->allocated.Get();
}

void CudaBackend::ResetPeakAllocation() { context_->allocated.ResetPeak(); }

std::shared_ptr<std::byte> CudaBackend::AllocateHost(size_t bytes) {
  void* p = nullptr;
  // The caller may be a thread of its own (a window's reader): without this
  // it would make a context on device 0.
  if (bytes > 0 && cudaSetDevice(context_->device) == cudaSuccess &&
      cudaHostAlloc(&p, bytes, cudaHostAllocDefault) == cudaSuccess) {
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p),
                                      [](std::byte* q) { cudaFreeHost(q); });
  }
  cudaGetLastError();  // page-locking can fail (limits): ordinary memory still works
  return Backend::AllocateHost(bytes);
}

namespace {

// What a queued asynchronous copy keeps until it is done.
struct PendingCopy {
  Tensor device;  // its memory stays allocated until the copy is done
  cudaEvent_t ready = nullptr;
  std::function<void(absl::Status)> done;
  WakeQueue* completions = nullptr;
};

// A host function: no CUDA calls here; the callback thread does the rest.
void CopyDone(void* arg) {
  auto* pending = static_cast<PendingCopy*>(arg);
  pending->completions->Post({[pending] {
    if (pending->ready != nullptr) cudaEventDestroy(pending->ready);
    pending->done(absl::OkStatus());
    delete pending;  // drops the tensor: cudaFreeAsync, allowed on this thread
  }});
}

}  // namespace

// `stream` waits for what the compute stream has queued so far (or up to
// the mark `after`), copies, and runs `done` on the callback thread; the
// compute stream goes on meanwhile.
void CudaBackend::QueueCopy(cudaStream_t stream, void* dst, const void* src, size_t bytes,
                            cudaMemcpyKind kind, const Tensor& device,
                            std::function<void(absl::Status)> done, const char* op,
                            cudaEvent_t after) {
  if (failed()) {
    done(status());
    return;
  }
  auto pending = std::make_unique<PendingCopy>();
  pending->device = device;
  pending->done = std::move(done);
  pending->completions = completions_.get();
  // The caller may be a thread of its own (a prefetch) on another device.
  cudaError_t err = cudaSetDevice(context_->device);
  if (after == nullptr) {
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&pending->ready, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventRecord(pending->ready, context_->stream);
  }
  if (err == cudaSuccess)
    err = cudaStreamWaitEvent(stream, after != nullptr ? after : pending->ready, 0);
  if (err == cudaSuccess && bytes > 0) err = cudaMemcpyAsync(dst, src, bytes, kind, stream);
  if (err == cudaSuccess) err = cudaLaunchHostFunc(stream, &CopyDone, pending.get());
  if (err != cudaSuccess) {
    if (pending->ready != nullptr) cudaEventDestroy(pending->ready);
    pending->done(CudaStatus(err, "cudaMemcpyAsync", op));
    return;
  }
  pending.release();  // CopyDone owns it now
}

void CudaBackend::DownloadAsync(const Tensor& src, absl::Span<std::byte> dst,
                                std::function<void(absl::Status)> done) {
  if (static_cast<int64_t>(dst.size()) != src.nbytes()) {
    done(absl::InvalidArgumentError(absl::StrCat("DownloadAsync: ", dst.size(),
                                                 " bytes for tensor ", ShapeString(src.shape()),
                                                 " of ", src.nbytes(), " bytes")));
    return;
  }
  QueueCopy(copy_stream_, dst.data(), src.storage(), dst.size(), cudaMemcpyDeviceToHost, src,
            std::move(done), "DownloadAsync");
}

void CudaBackend::UploadAsync(absl::Span<const std::byte> src, Tensor& dst,
                              std::function<void(absl::Status)> done) {
  UploadAsyncAfter(src, dst, nullptr, std::move(done));
}

std::shared_ptr<const void> CudaBackend::QueuedWorkMark() {
  if (failed()) return nullptr;
  cudaEvent_t event = nullptr;
  // The caller may be a thread of its own (a prefetch) on another device.
  cudaError_t err = cudaSetDevice(context_->device);
  if (err == cudaSuccess) err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaEventRecord(event, context_->stream);
  if (err != cudaSuccess) {
    // The uploads then each wait for what is queued when they are: later,
    // never wrong.
    if (event != nullptr) cudaEventDestroy(event);
    return nullptr;
  }
  // Destroyed once the last upload that waits on it is queued (CUDA keeps
  // an event that streams still wait for until it completes).
  return std::shared_ptr<const void>(static_cast<const void*>(event), [](const void* e) {
    cudaEventDestroy(static_cast<cudaEvent_t>(const_cast<void*>(e)));
  });
}

void CudaBackend::UploadAsyncAfter(absl::Span<const std::byte> src, Tensor& dst,
                                   const std::shared_ptr<const void>& mark,
                                   std::function<void(absl::Status)> done) {
  if (static_cast<int64_t>(src.size()) != dst.nbytes()) {
    done(absl::InvalidArgumentError(absl::StrCat("UploadAsync: ", src.size(), " bytes for tensor ",
                                                 ShapeString(dst.shape()), " of ", dst.nbytes(),
                                                 " bytes")));
    return;
  }
  QueueCopy(upload_stream_, dst.storage(), src.data(), src.size(), cudaMemcpyHostToDevice, dst,
            std::move(done), "UploadAsync",
            static_cast<cudaEvent_t>(const_cast<void*>(mark.get())));  // null: queued so far
}

Tensor CudaBackend::Cast(const Tensor& src, DType dtype) {
  Tensor y = Empty(dtype, src.shape());
  ZO_CUDA_OP(LaunchCast(In(src), Out(y), src.numel(), context_->stream), "LaunchCast", "Cast",
             [&] { return Describe("src", src); });
  return y;
}

void CudaBackend::Synchronize() {
  ZO_CUDA_OP(cudaStreamSynchronize(context_->stream), "cudaStreamSynchronize", "Synchronize",
             [] { return std::string("the backend's stream"); });
}

Tensor CudaBackend::UploadIndices(absl::Span<const int32_t> indices, const char* op) {
  Tensor t = Empty(DType::kFloat32, {static_cast<int64_t>(indices.size())});  // 4-byte slots
  if (!indices.empty()) {
    ZO_CUDA_OP(cudaMemcpyAsync(t.storage(), indices.data(), indices.size() * sizeof(int32_t),
                               cudaMemcpyHostToDevice, context_->stream),
               "cudaMemcpyAsync", op, [&] { return absl::StrCat(indices.size(), " indices"); });
  }
  return t;
}

}  // namespace cuda
}  // namespace zo::backend
