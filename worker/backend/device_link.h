// A point-to-point channel between the devices of two processes that cannot
// map each other's memory (device_sharing.h): stage processes on different
// hosts, over NCCL send/recv. Two processes agree on a link in the pipeline
// handshake: each offers one, and both Join the lower stage's offer.
//
// Each direction is a FIFO: the sender's Sends and the receiver's Recvs
// pair up in order and must agree on the sizes (the TCP header that goes
// with each Send says what the Recv is).
#ifndef ZO_WORKER_BACKEND_DEVICE_LINK_H_
#define ZO_WORKER_BACKEND_DEVICE_LINK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "worker/backend/tensor.h"

namespace zo::backend {

class DeviceLink {
 public:
  virtual ~DeviceLink() = default;
  // Queues sending `src` once the work queued before this call is done and
  // returns without waiting; the link keeps `src` until it is sent.
  virtual absl::Status Send(const Tensor& src) = 0;
  // A new tensor holding what the peer's next Send carries, once it is here.
  virtual absl::StatusOr<Tensor> Recv(DType dtype, const Shape& shape) = 0;
};

class DeviceLinks {
 public:
  virtual ~DeviceLinks() = default;
  // Opaque bytes for the handshake (NCCL's unique ids).
  virtual absl::StatusOr<std::string> Offer() = 0;
  // Joins the link of `offer` (the lower stage's) as `rank` (0: the lower
  // stage, 1: the higher); returns once the peer has joined too.
  virtual absl::StatusOr<std::unique_ptr<DeviceLink>> Join(absl::string_view offer, int rank) = 0;
};

}  // namespace zo::backend

#endif  // ZO_WORKER_BACKEND_DEVICE_LINK_H_
