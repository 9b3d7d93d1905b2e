// The CPU backend's DeviceSharing (worker/backend/device_sharing.h): an
// inbox is a memfd mapped shared, which the peer process opens through
// /proc/<pid>/fd/<fd>. Put and Take are memcpys of the fp32 storage, so
// stage processes on one host copy each activation twice in all instead of
// pushing it through the socket's buffers.
#ifndef ZO_WORKER_BACKEND_CPU_INTERNAL_HOST_SHARING_H_
#define ZO_WORKER_BACKEND_CPU_INTERNAL_HOST_SHARING_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/backend/backend.h"
#include "worker/backend/device_sharing.h"

namespace zo::backend::cpu {

class HostSharing final : public DeviceSharing {
 public:
  // `backend` allocates the tensors Take returns and must outlive this.
  explicit HostSharing(Backend& backend) : backend_(backend) {}

  absl::StatusOr<std::unique_ptr<Inbox>> CreateInbox(int slots, int64_t slot_bytes) override;
  absl::StatusOr<std::unique_ptr<PeerInbox>> OpenPeerInbox(absl::string_view handle) override;

 private:
  Backend& backend_;
};

}  // namespace zo::backend::cpu

#endif  // ZO_WORKER_BACKEND_CPU_INTERNAL_HOST_SHARING_H_
