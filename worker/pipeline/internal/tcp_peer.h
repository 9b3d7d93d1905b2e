// TcpTransport's state of one neighbour (or of the stage itself), shared by
// tcp_connector.cc, which sets it up, and tcp_transport.cc, which uses it.
#ifndef ZO_WORKER_PIPELINE_INTERNAL_TCP_PEER_H_
#define ZO_WORKER_PIPELINE_INTERNAL_TCP_PEER_H_

#include <array>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/backend/device_link.h"
#include "worker/backend/device_sharing.h"
#include "worker/backend/tensor.h"
#include "worker/pipeline/internal/tcp_socket.h"
#include "worker/pipeline/internal/tcp_wire.h"
#include "worker/pipeline/tcp_transport.h"
#include "worker/pipeline/transport.h"

namespace zo::pipeline {

struct TcpTransport::Peer {
  int stage = 0;
  std::string address;
  int fd = -1;  // -1: this stage itself (an in-memory queue)
  std::thread reader;

  std::mutex write_mu;
  absl::Status write_status;  // sticky, guarded by write_mu

  std::mutex mu;
  std::condition_variable arrived;
  std::deque<std::pair<MessageTag, backend::Tensor>> queue;  // guarded by mu
  absl::Status read_status;                                  // sticky, guarded by mu

  // Memory shared with this peer (both null on the socket route).
  std::unique_ptr<backend::Inbox> inbox;       // ours, the peer Puts into it
  std::unique_ptr<backend::PeerInbox> outbox;  // the peer's, mapped here
  std::unique_ptr<backend::DeviceLink> link;   // both ways, when joined
  std::string route;
  std::mutex put_mu;  // one Put at a time into the outbox
  std::condition_variable slot_freed;
  std::vector<int> free_slots;             // of the outbox; guarded by mu
  std::vector<backend::Tensor> in_flight;  // by outbox slot, kept until its credit; guarded by mu

  std::string Name() const { return absl::StrCat("stage ", stage, " at ", address); }

  // Writes a header that carries no payload (its tensor is in an inbox or
  // on the link, or it is a credit); write_mu held. A failure is sticky.
  absl::Status WriteHeaderLocked(const pipeline_internal::FrameHeader& h) {
    if (!write_status.ok()) return write_status;
    std::array<std::byte, pipeline_internal::kFrameHeaderBytes> bytes;
    pipeline_internal::EncodeFrameHeader(h, bytes.data());
    if (absl::Status s = pipeline_internal::WriteAll(fd, bytes.data(), bytes.size(), 0); !s.ok()) {
      write_status = absl::UnavailableError(
          absl::StrCat(h.credit ? absl::StrCat("returning inbox slot ", h.slot, " to ")
                                : absl::StrCat("sending ", ToString(h.tag), " to "),
                       Name(), ": ", s.message()));
    }
    return write_status;
  }
};

}  // namespace zo::pipeline

#endif  // ZO_WORKER_PIPELINE_INTERNAL_TCP_PEER_H_
