#include "worker/backend/cuda/internal/cuda_sharing.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/backend/cuda/internal/cuda_backend_impl.h"

namespace zo::backend::cuda {
namespace {

constexpr absl::string_view kPrefix = "cuda-ipc:";

// The handle's bytes after the prefix: a fixed header, then one event
// handle per slot.
struct HandleHeader {
  uint32_t pid = 0;  // the exporting process: IPC cannot map its own memory
  uint32_t slots = 0;
  int64_t slot_bytes = 0;
  cudaIpcMemHandle_t memory{};
};

absl::Status Error(cudaError_t err, const char* call, const std::string& what) {
  cudaGetLastError();  // not sticky: the device goes on working
  return CudaCallError(call, "pipeline inbox", what, cudaGetErrorString(err));
}

class CudaInbox final : public Inbox {
 public:
  CudaInbox(std::shared_ptr<DeviceContext> context, int slots, int64_t slot_bytes)
      : context_(std::move(context)), slots_(slots), slot_bytes_(slot_bytes) {}

  ~CudaInbox() override {
    cudaSetDevice(context_->device);
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (base_ != nullptr) cudaFree(base_);
  }

  absl::Status Init() {
    const std::string what = absl::StrCat(slots_, " slots of ", slot_bytes_, " bytes");
    cudaError_t err = cudaSetDevice(context_->device);
    if (err != cudaSuccess) return Error(err, "cudaSetDevice", what);
    if ((err = cudaMalloc(&base_, static_cast<size_t>(slots_ * slot_bytes_))) != cudaSuccess) {
      base_ = nullptr;
      return Error(err, "cudaMalloc", what);
    }
    if ((err = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)) != cudaSuccess) {
      stream_ = nullptr;
      return Error(err, "cudaStreamCreateWithFlags", what);
    }
    HandleHeader header{.pid = static_cast<uint32_t>(getpid()),
                        .slots = static_cast<uint32_t>(slots_),
                        .slot_bytes = slot_bytes_};
    if ((err = cudaIpcGetMemHandle(&header.memory, base_)) != cudaSuccess) {
      return Error(err, "cudaIpcGetMemHandle", what);
    }
    handle_ = std::string(kPrefix);
    handle_.append(reinterpret_cast<const char*>(&header), sizeof(header));
    for (int i = 0; i < slots_; ++i) {
      cudaEvent_t e = nullptr;
      err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventInterprocess);
      if (err != cudaSuccess) return Error(err, "cudaEventCreateWithFlags", what);
      events_.push_back(e);
      cudaIpcEventHandle_t event_handle{};
      if ((err = cudaIpcGetEventHandle(&event_handle, e)) != cudaSuccess) {
        return Error(err, "cudaIpcGetEventHandle", what);
      }
      handle_.append(reinterpret_cast<const char*>(&event_handle), sizeof(event_handle));
    }
    return absl::OkStatus();
  }

  const std::string& handle() const override { return handle_; }
  int slots() const override { return slots_; }

  absl::StatusOr<Tensor> Take(int slot, DType dtype, const Shape& shape) override {
    const int64_t bytes = NumElements(shape) * static_cast<int64_t>(DTypeSize(dtype));
    const std::string what =
        absl::StrCat("slot ", slot, ", ", ShapeString(shape), " ", std::string(DTypeName(dtype)));
    if (slot < 0 || slot >= slots_ || bytes > slot_bytes_) {
      return absl::DataLossError(
          absl::StrCat(what, ": the inbox has ", slots_, " slots of ", slot_bytes_, " bytes"));
    }
    cudaError_t err = cudaSetDevice(context_->device);
    if (err != cudaSuccess) return Error(err, "cudaSetDevice", what);
    absl::StatusOr<Tensor> t = AllocateOnStream(context_, stream_, dtype, shape, what);
    if (!t.ok()) return t.status();
    err = cudaStreamWaitEvent(stream_, events_[static_cast<size_t>(slot)], 0);
    if (err == cudaSuccess && bytes > 0) {
      err = cudaMemcpyAsync(t->storage(), static_cast<std::byte*>(base_) + slot * slot_bytes_,
                            static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream_);
    }
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream_);
    if (err != cudaSuccess) return Error(err, "cudaMemcpyAsync", what);
    return t;
  }

 private:
  std::shared_ptr<DeviceContext> context_;
  const int slots_;
  const int64_t slot_bytes_;
  void* base_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
  std::string handle_;
};

class CudaPeerInbox final : public PeerInbox {
 public:
  CudaPeerInbox(std::shared_ptr<DeviceContext> context, int slots, int64_t slot_bytes)
      : context_(std::move(context)), slots_(slots), slot_bytes_(slot_bytes) {}

  ~CudaPeerInbox() override {
    cudaSetDevice(context_->device);
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    if (queued_ != nullptr) cudaEventDestroy(queued_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (base_ != nullptr) cudaIpcCloseMemHandle(base_);
  }

  absl::Status Init(const HandleHeader& header, const char* event_handles) {
    const std::string what = "the peer's inbox";
    cudaError_t err = cudaSetDevice(context_->device);
    if (err != cudaSuccess) return Error(err, "cudaSetDevice", what);
    if ((err = cudaIpcOpenMemHandle(&base_, header.memory, cudaIpcMemLazyEnablePeerAccess)) !=
        cudaSuccess) {
      base_ = nullptr;
      return Error(err, "cudaIpcOpenMemHandle", what);
    }
    for (int i = 0; i < slots_; ++i) {
      cudaIpcEventHandle_t event_handle;
      std::memcpy(&event_handle, event_handles + i * sizeof(event_handle), sizeof(event_handle));
      cudaEvent_t e = nullptr;
      if ((err = cudaIpcOpenEventHandle(&e, event_handle)) != cudaSuccess) {
        return Error(err, "cudaIpcOpenEventHandle", what);
      }
      events_.push_back(e);
    }
    if ((err = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)) != cudaSuccess) {
      stream_ = nullptr;
      return Error(err, "cudaStreamCreateWithFlags", what);
    }
    if ((err = cudaEventCreateWithFlags(&queued_, cudaEventDisableTiming)) != cudaSuccess) {
      queued_ = nullptr;
      return Error(err, "cudaEventCreateWithFlags", what);
    }
    return absl::OkStatus();
  }

  int slots() const override { return slots_; }
  bool Fits(const Tensor& t) const override { return t.nbytes() <= slot_bytes_; }

  absl::Status Put(int slot, const Tensor& src) override {
    const std::string what = absl::StrCat("slot ", slot, ", ", Describe("src", src));
    if (slot < 0 || slot >= slots_ || !Fits(src)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Put of ", what, " into ", slots_, " slots of ", slot_bytes_, " bytes"));
    }
    // After what the compute stream has queued (src's producer), beside
    // what it queues next.
    cudaError_t err = cudaSetDevice(context_->device);
    if (err == cudaSuccess) err = cudaEventRecord(queued_, context_->stream);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(stream_, queued_, 0);
    if (err == cudaSuccess && src.nbytes() > 0) {
      err = cudaMemcpyAsync(static_cast<std::byte*>(base_) + slot * slot_bytes_, src.storage(),
                            static_cast<size_t>(src.nbytes()), cudaMemcpyDefault, stream_);
    }
    if (err == cudaSuccess) err = cudaEventRecord(events_[static_cast<size_t>(slot)], stream_);
    if (err != cudaSuccess) return Error(err, "cudaMemcpyAsync", what);
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<DeviceContext> context_;
  const int slots_;
  const int64_t slot_bytes_;
  void* base_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t queued_ = nullptr;
  std::vector<cudaEvent_t> events_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Inbox>> CudaSharing::CreateInbox(int slots, int64_t slot_bytes) {
  if (slots < 1 || slot_bytes < 1 || slot_bytes > (int64_t{1} << 40) / slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("an inbox of ", slots, " slots of ", slot_bytes, " bytes"));
  }
  auto inbox = std::make_unique<CudaInbox>(context_, slots, slot_bytes);
  if (absl::Status s = inbox->Init(); !s.ok()) {
    return absl::ResourceExhaustedError(s.message());
  }
  return inbox;
}

absl::StatusOr<std::unique_ptr<PeerInbox>> CudaSharing::OpenPeerInbox(absl::string_view handle) {
  if (!absl::StartsWith(handle, kPrefix)) {
    return absl::FailedPreconditionError("the peer's inbox is not CUDA memory");
  }
  handle.remove_prefix(kPrefix.size());
  HandleHeader header;
  if (handle.size() < sizeof(header)) {
    return absl::FailedPreconditionError("garbled CUDA inbox handle");
  }
  std::memcpy(&header, handle.data(), sizeof(header));
  if (header.slots < 1 || header.slots > 1024 || header.slot_bytes < 1 ||
      handle.size() != sizeof(header) + header.slots * sizeof(cudaIpcEventHandle_t)) {
    return absl::FailedPreconditionError("garbled CUDA inbox handle");
  }
  if (header.pid == static_cast<uint32_t>(getpid())) {
    return absl::FailedPreconditionError(
        "the peer is this process (CUDA IPC maps another's memory)");
  }
  auto inbox =
      std::make_unique<CudaPeerInbox>(context_, static_cast<int>(header.slots), header.slot_bytes);
  if (absl::Status s = inbox->Init(header, handle.data() + sizeof(header)); !s.ok()) {
    return absl::FailedPreconditionError(s.message());
  }
  return inbox;
}

}  // namespace zo::backend::cuda
