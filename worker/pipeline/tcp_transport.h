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
#ifndef ZO_WORKER_PIPELINE_TCP_TRANSPORT_H_
#define ZO_WORKER_PIPELINE_TCP_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
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

 private:
  struct Peer;

  TcpTransport(const TcpTransportOptions& options, backend::Backend& backend);
  Peer* FindPeer(int stage) const;
  void ReadLoop(Peer* peer);
  absl::Status ReadOneMessage(Peer* peer);

  const TcpTransportOptions options_;
  backend::Backend& backend_;
  std::vector<std::unique_ptr<Peer>> peers_;  // fixed once Connect returns
};

}  // namespace zo::pipeline

#endif  // ZO_WORKER_PIPELINE_TCP_TRANSPORT_H_
