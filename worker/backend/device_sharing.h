// Memory a backend shares with another process on the same host: how
// pipeline stages in separate processes on one host hand activations over
// without pushing their bytes through a socket (CUDA IPC for GPU memory,
// a shared memory file for the CPU backend's host memory).
//
// The receiving process allocates an Inbox of fixed slots and passes its
// handle to the sender (the pipeline's TCP handshake carries it); the sender
// opens it as a PeerInbox and Puts a tensor into a free slot; the receiver
// Takes it out into a tensor of its own. Which slots are free is the
// caller's business (the TCP transport returns a credit per Take).
#ifndef ZO_WORKER_BACKEND_DEVICE_SHARING_H_
#define ZO_WORKER_BACKEND_DEVICE_SHARING_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "worker/backend/tensor.h"

namespace zo::backend {

// Slots this process allocated, written by one peer process.
class Inbox {
 public:
  virtual ~Inbox() = default;
  // Opaque bytes for the peer's DeviceSharing::OpenPeerInbox.
  virtual const std::string& handle() const = 0;
  virtual int slots() const = 0;
  // A new tensor of `dtype` and `shape` holding what the peer Put into
  // `slot`, once that Put's copy is complete; the slot may be written again
  // when this returns. DATA_LOSS when the slot number or the size is not one
  // the inbox has (a garbled header).
  virtual absl::StatusOr<Tensor> Take(int slot, DType dtype, const Shape& shape) = 0;
};

// A peer's Inbox, mapped into this process.
class PeerInbox {
 public:
  virtual ~PeerInbox() = default;
  virtual int slots() const = 0;
  // Whether `t` fits in a slot (larger tensors go another way).
  virtual bool Fits(const Tensor& t) const = 0;
  // Copies `src` into `slot` once the work queued before this call is done.
  // May return before the copy is: the peer's Take waits for it, and `src`
  // must stay allocated until the peer has taken the slot.
  virtual absl::Status Put(int slot, const Tensor& src) = 0;
};

class DeviceSharing {
 public:
  virtual ~DeviceSharing() = default;
  // RESOURCE_EXHAUSTED when the memory cannot be had.
  virtual absl::StatusOr<std::unique_ptr<Inbox>> CreateInbox(int slots, int64_t slot_bytes) = 0;
  // FAILED_PRECONDITION when the handle is another kind of backend's or
  // cannot be mapped here (another container, no peer access): the caller
  // then sends through its socket.
  virtual absl::StatusOr<std::unique_ptr<PeerInbox>> OpenPeerInbox(absl::string_view handle) = 0;
};

}  // namespace zo::backend

#endif  // ZO_WORKER_BACKEND_DEVICE_SHARING_H_
