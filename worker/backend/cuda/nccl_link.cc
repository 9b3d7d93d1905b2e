#include "worker/backend/cuda/internal/nccl_link.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstring>
#include <deque>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/backend/cuda/internal/cuda_backend_impl.h"

namespace zo::backend::cuda {
namespace {

constexpr absl::string_view kPrefix = "nccl:";

// NCCL's entry points, from libnccl.so.2 loaded at run time: NCCL is 200 MB
// that only stages on different hosts need, so a machine without it still
// runs everything else (links() is then null).
struct Nccl {
  decltype(&::ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&::ncclCommInitRank) CommInitRank = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclSend) Send = nullptr;
  decltype(&::ncclRecv) Recv = nullptr;
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;
};

const Nccl* LoadNccl() {
  static const Nccl* const nccl = []() -> const Nccl* {
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return nullptr;
    auto* api = new Nccl;  // lives as long as the process, as the library
    bool ok = true;
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      ok = ok && fn != nullptr;
    };
    get(api->GetUniqueId, "ncclGetUniqueId");
    get(api->CommInitRank, "ncclCommInitRank");
    get(api->CommDestroy, "ncclCommDestroy");
    get(api->Send, "ncclSend");
    get(api->Recv, "ncclRecv");
    get(api->GetErrorString, "ncclGetErrorString");
    return ok ? api : nullptr;
  }();
  return nccl;
}

absl::Status NcclError(ncclResult_t r, const char* call, const std::string& what) {
  return absl::InternalError(
      absl::StrCat("nccl: ", call, " failed (", what, "): ", LoadNccl()->GetErrorString(r)));
}

absl::Status CudaError(cudaError_t err, const char* call, const std::string& what) {
  cudaGetLastError();
  return CudaCallError(call, "device link", what, cudaGetErrorString(err));
}

class NcclLink final : public DeviceLink {
 public:
  NcclLink(std::shared_ptr<DeviceContext> context, int rank)
      : context_(std::move(context)), peer_(1 - rank) {}

  ~NcclLink() override {
    cudaSetDevice(context_->device);
    for (cudaStream_t s : {send_stream_, recv_stream_}) {
      if (s != nullptr) cudaStreamSynchronize(s);
    }
    for (auto& [event, tensor] : sending_) cudaEventDestroy(event);
    if (queued_ != nullptr) cudaEventDestroy(queued_);
    for (ncclComm_t c : {send_comm_, recv_comm_}) {
      if (c != nullptr) LoadNccl()->CommDestroy(c);
    }
    for (cudaStream_t s : {send_stream_, recv_stream_}) {
      if (s != nullptr) cudaStreamDestroy(s);
    }
  }

  // Both communicators, in the same order on both sides (each init waits
  // for the peer's): ids[0] carries rank 0's sends, ids[1] rank 1's.
  absl::Status Init(const ncclUniqueId ids[2], int rank) {
    cudaError_t err = cudaSetDevice(context_->device);
    if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&send_stream_, cudaStreamNonBlocking);
    if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&recv_stream_, cudaStreamNonBlocking);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&queued_, cudaEventDisableTiming);
    if (err != cudaSuccess) return CudaError(err, "cudaStreamCreateWithFlags", "link streams");
    for (int direction = 0; direction < 2; ++direction) {
      ncclComm_t& comm = direction == rank ? send_comm_ : recv_comm_;
      if (ncclResult_t r = LoadNccl()->CommInitRank(&comm, 2, ids[direction], rank);
          r != ncclSuccess) {
        comm = nullptr;
        return NcclError(r, "ncclCommInitRank", absl::StrCat("rank ", rank, " of 2"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Send(const Tensor& src) override {
    const std::string what = Describe("src", src);
    cudaError_t err = cudaSetDevice(context_->device);
    // Tensors whose send has finished may go.
    while (!sending_.empty() && cudaEventQuery(sending_.front().first) == cudaSuccess) {
      cudaEventDestroy(sending_.front().first);
      sending_.pop_front();
    }
    if (err == cudaSuccess) err = cudaEventRecord(queued_, context_->stream);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(send_stream_, queued_, 0);
    if (err != cudaSuccess) return CudaError(err, "cudaStreamWaitEvent", what);
    if (src.nbytes() > 0) {
      if (ncclResult_t r = LoadNccl()->Send(src.storage(), static_cast<size_t>(src.nbytes()),
                                            ncclUint8, peer_, send_comm_, send_stream_);
          r != ncclSuccess) {
        return NcclError(r, "ncclSend", what);
      }
    }
    cudaEvent_t sent = nullptr;
    err = cudaEventCreateWithFlags(&sent, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventRecord(sent, send_stream_);
    if (err != cudaSuccess) return CudaError(err, "cudaEventRecord", what);
    sending_.emplace_back(sent, src);
    return absl::OkStatus();
  }

  absl::StatusOr<Tensor> Recv(DType dtype, const Shape& shape) override {
    const int64_t bytes = NumElements(shape) * static_cast<int64_t>(DTypeSize(dtype));
    const std::string what = absl::StrCat(ShapeString(shape), " ", std::string(DTypeName(dtype)));
    cudaError_t err = cudaSetDevice(context_->device);
    if (err != cudaSuccess) return CudaError(err, "cudaSetDevice", what);
    absl::StatusOr<Tensor> t = AllocateOnStream(context_, recv_stream_, dtype, shape, what);
    if (!t.ok()) return t.status();
    if (bytes > 0) {
      if (ncclResult_t r = LoadNccl()->Recv(t->storage(), static_cast<size_t>(bytes), ncclUint8,
                                            peer_, recv_comm_, recv_stream_);
          r != ncclSuccess) {
        return NcclError(r, "ncclRecv", what);
      }
    }
    if ((err = cudaStreamSynchronize(recv_stream_)) != cudaSuccess) {
      return CudaError(err, "cudaStreamSynchronize", what);
    }
    return t;
  }

 private:
  std::shared_ptr<DeviceContext> context_;
  const int peer_;
  ncclComm_t send_comm_ = nullptr;
  ncclComm_t recv_comm_ = nullptr;
  cudaStream_t send_stream_ = nullptr;
  cudaStream_t recv_stream_ = nullptr;
  cudaEvent_t queued_ = nullptr;
  std::deque<std::pair<cudaEvent_t, Tensor>> sending_;  // kept until sent
};

}  // namespace

bool NcclLinks::Available() { return LoadNccl() != nullptr; }

absl::StatusOr<std::string> NcclLinks::Offer() {
  ncclUniqueId ids[2];
  for (ncclUniqueId& id : ids) {
    if (ncclResult_t r = LoadNccl()->GetUniqueId(&id); r != ncclSuccess) {
      return NcclError(r, "ncclGetUniqueId", "a link offer");
    }
  }
  std::string offer(kPrefix);
  offer.append(reinterpret_cast<const char*>(ids), sizeof(ids));
  return offer;
}

absl::StatusOr<std::unique_ptr<DeviceLink>> NcclLinks::Join(absl::string_view offer, int rank) {
  ncclUniqueId ids[2];
  if (!absl::StartsWith(offer, kPrefix) || offer.size() != kPrefix.size() + sizeof(ids) ||
      (rank != 0 && rank != 1)) {
    return absl::FailedPreconditionError("the peer's device link is not an NCCL one");
  }
  std::memcpy(ids, offer.data() + kPrefix.size(), sizeof(ids));
  auto link = std::make_unique<NcclLink>(context_, rank);
  if (absl::Status s = link->Init(ids, rank); !s.ok()) return s;
  return link;
}

}  // namespace zo::backend::cuda
