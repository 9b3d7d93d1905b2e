// A transport between pipeline stages in separate processes, over TCP.
//
// A stage talks only to its ring neighbours, stage - 1 and stage + 1 (mod
// stages): one connection per neighbouring pair, accepted by the
// lower-numbered stage and dialled by the higher one (with retries until
// connect_timeout, since the peer process may start later). Both ends first
// exchange a handshake (protocol version, job, stages, stage id) and refuse a
// peer from another job or configuration. Wire format: internal/tcp_wire.h.
//
// A reader thread per connection drains the socket into a per-peer queue, so
// two stages sending large tensors to each other at once never block on full
// socket buffers. A stage that sends to itself (one stage running several
// chunks) goes through an in-memory queue.
//
// Neighbours on the same host whose backend can share memory
// (Backend::sharing(): CUDA IPC, a shared memory file for the CPU) skip the
// socket for the tensor's bytes: after the handshake each gives the other an
// inbox of slots, a sender Puts a tensor into a free slot of the receiver's
// inbox and sends only the header naming the slot, and the receiver's
// reader Takes it out and returns a credit frame that frees the slot.
// Tensors larger than a slot, peers on other hosts and inboxes that cannot
// be mapped go through the socket.
//
// Neighbours on different hosts whose backends have device links
// (Backend::links(): NCCL) send tensors over the link instead, the socket
// again carrying only the headers. Both say in the handshake that they can,
// and join the lower stage's offer, so both decide alike.
#ifndef ZO_WORKER_PIPELINE_TCP_TRANSPORT_H_
#define ZO_WORKER_PIPELINE_TCP_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/wake_queue.h"
#include "worker/backend/backend.h"
#include "worker/pipeline/transport.h"

namespace zo::pipeline {

struct TcpTransportOptions {
  int stage = 0;
  int stages = 1;
  // "host:port" of every stage ("[::1]:5000" for IPv6); this stage listens
  // on addresses[stage] (port 0 is not supported: pick the ports up front).
  std::vector<std::string> addresses;
  // Checked in the handshake, as are stages and the peer's stage id.
  std::string job;
  // For all connections and handshakes of Connect together.
  absl::Duration connect_timeout = absl::Seconds(60);
  absl::Duration recv_timeout = absl::Minutes(10);
  // Larger incoming messages are refused as DATA_LOSS (a garbled header).
  int64_t max_message_bytes = int64_t{1} << 30;
  // Offer neighbours on this host an inbox of inbox_slots x inbox_slot_bytes
  // of the backend's memory (device memory on a GPU), when the backend can
  // share it. More slots let a sender run further ahead of its receiver.
  bool share_memory = true;
  int inbox_slots = 4;
  int64_t inbox_slot_bytes = int64_t{64} << 20;
  // Offer a device link (NCCL) to neighbours on other hosts, when the
  // backend has one; with prefer_device_link, to neighbours on this host
  // too (two GPUs of one machine over NCCL rather than CUDA IPC).
  bool device_links = true;
  bool prefer_device_link = false;
  // Called once per neighbour whose connection fails or closes (it died),
  // from a reader thread, not while the transport is being destroyed: what
  // this process waits on elsewhere (the servers) may need that neighbour.
  std::function<void(int stage, const absl::Status& why)> on_peer_lost = nullptr;
};

struct TcpTransportStats {
  int64_t messages_linked = 0;       // sent over a device link
  int64_t messages_shared = 0;       // sent through a neighbour's inbox
  int64_t messages_over_socket = 0;  // sent with their bytes on the socket
};

// Thread-safe: Send and Recv may be called from several threads (writes to
// one peer are serialised; a direction is a FIFO only for one caller).
class TcpTransport final : public Transport {
 public:
  // Listens, dials and handshakes with the neighbours; returns when all are
  // connected. INVALID_ARGUMENT for bad options or addresses;
  // FAILED_PRECONDITION when a peer runs another job, stage count or
  // protocol version, or is not the stage expected at its address;
  // DATA_LOSS when something that is not a stage answers; DEADLINE_EXCEEDED
  // when a neighbour does not turn up within connect_timeout. `backend`
  // allocates received tensors and must outlive the transport.
  static absl::StatusOr<std::unique_ptr<TcpTransport>> Connect(const TcpTransportOptions& options,
                                                               backend::Backend& backend);

  // Shuts the connections down (peers then get UNAVAILABLE) and joins the
  // reader threads. Messages not yet received are dropped.
  ~TcpTransport() override;

  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  // INVALID_ARGUMENT when `to` is not a neighbour (or this stage) or the
  // tensor is undefined; UNAVAILABLE when the connection failed (sticky).
  absl::Status Send(int to, const MessageTag& tag, const backend::Tensor& tensor) override;
  // Messages that arrived before a peer went away are still delivered; then
  // UNAVAILABLE naming the peer's stage and address, or DATA_LOSS when it
  // sent a garbled frame.
  absl::StatusOr<backend::Tensor> Recv(int from, const MessageTag& tag) override;

  // How tensors for neighbour `stage` travel, for the log: "shared memory
  // (cuda IPC)" or "the socket (the peer runs on another host)".
  std::string Route(int stage) const;
  TcpTransportStats stats() const;

 private:
  struct Peer;
  class Connector;  // Connect's steps

  TcpTransport(const TcpTransportOptions& options, backend::Backend& backend);
  Peer* FindPeer(int stage) const;
  void ReadLoop(Peer* peer);
  absl::Status ReadOneMessage(Peer* peer);
  absl::Status SendShared(Peer* peer, const MessageTag& tag, const backend::Tensor& tensor);
  absl::Status SendLinked(Peer* peer, const MessageTag& tag, const backend::Tensor& tensor);
  void ReturnCredit(Peer* peer, int slot);

  const TcpTransportOptions options_;
  backend::Backend& backend_;
  std::vector<std::unique_ptr<Peer>> peers_;  // fixed once Connect returns
  std::atomic<bool> closing_{false};          // set first by the destructor
  // Writes credit frames, so a reader never waits for a peer's write lock
  // (that writer may be blocked on a socket only this reader drains).
  std::unique_ptr<WakeQueue> credit_writer_;
  std::atomic<int64_t> messages_linked_{0};
  std::atomic<int64_t> messages_shared_{0};
  std::atomic<int64_t> messages_over_socket_{0};
};

}  // namespace zo::pipeline

#endif  // ZO_WORKER_PIPELINE_TCP_TRANSPORT_H_
