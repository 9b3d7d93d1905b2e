// The CUDA backend's DeviceSharing (worker/backend/device_sharing.h): CUDA
// IPC. An inbox is one cudaMalloc'd block of slots (pool memory cannot be
// exported) with an interprocess event per slot; its handle carries the
// block's and the events' IPC handles. The sender copies a tensor into a
// slot on a stream of its own, after the work its compute stream has
// queued, and records the slot's event there, so Put never waits on the
// host; Take waits for that event on the receiver's stream, copies the slot
// into a new tensor and waits for that copy alone before the slot is
// handed back. Nothing crosses host memory.
#ifndef ZO_WORKER_BACKEND_CUDA_INTERNAL_CUDA_SHARING_H_
#define ZO_WORKER_BACKEND_CUDA_INTERNAL_CUDA_SHARING_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/backend/device_sharing.h"

namespace zo::backend::cuda {

struct DeviceContext;

class CudaSharing final : public DeviceSharing {
 public:
  explicit CudaSharing(std::shared_ptr<DeviceContext> context) : context_(std::move(context)) {}

  absl::StatusOr<std::unique_ptr<Inbox>> CreateInbox(int slots, int64_t slot_bytes) override;
  // FAILED_PRECONDITION for an inbox of this same process (CUDA IPC maps
  // only another process's memory) or one the driver cannot map.
  absl::StatusOr<std::unique_ptr<PeerInbox>> OpenPeerInbox(absl::string_view handle) override;

 private:
  std::shared_ptr<DeviceContext> context_;
};

}  // namespace zo::backend::cuda

#endif  // ZO_WORKER_BACKEND_CUDA_INTERNAL_CUDA_SHARING_H_
