// The one way zo opens a channel to a zo-server: the worker's client, a
// server calling its peers and zo-ctl all use it, so they agree on message
// sizes, TLS and how fast a lost connection comes back.
//
//   ZO_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
//                       NewChannel("127.0.0.1:7070", {.tls_root_certs = pem}));
//
// The auth token is not a channel option: gRPC sends call credentials only
// over TLS, and zo-server accepts a token over plaintext too (on loopback),
// so the token travels as per-call metadata (rpc/call_context.h).
#ifndef ZO_RPC_CHANNEL_H_
#define ZO_RPC_CHANNEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "rpc/pings.h"

namespace zo {

// The protocol's bound on one message (docs/architecture.md, "Failure, bad input"),
// above gRPC's 4 MiB default so that pieces of a few MiB pass.
inline constexpr int kMaxMessageBytes = 64 << 20;

struct ChannelOptions {
  // PEM of the CA that signed the server's certificate; non-empty: TLS,
  // empty: plaintext.
  std::string tls_root_certs = "";
  // Largest message sent or received, either way.
  int max_message_bytes = kMaxMessageBytes;
  // rpc/pings.h; shorter only in tests, against a server that accepts it.
  absl::Duration ping_every = kPingEvery;
  absl::Duration ping_answered_within = kPingAnsweredWithin;
};

// gRPC learns that a connect attempt ended only while some thread polls the
// channel. A call on a channel whose last connect failed fails at once and
// polls nothing, so a client retrying a server that is (re)starting learns
// of each attempt from gRPC's backup poller, every 5 s by default: a server
// up 2 s after the client's first call was still "refused" after 10 s of
// retries. This sets that poller to 100 ms. It must run before gRPC's
// first use in the process: NewChannel and OffloadServer::Start call it.
void SeeConnectsPromptly();

// A channel to `address` ("host:port", "[v6]:port", the port in
// [1, 65535]; common/host_port.h), with a connection of its own rather than
// one shared with every channel of the process to the same address,
// reconnect backoff capped at 2 s, and pings while calls are open
// (rpc/pings.h). INVALID_ARGUMENT naming `address` when it is not host:port,
// or when max_message_bytes < 1 or a ping duration is under 1 ms. Connects
// lazily: an unreachable server shows as UNAVAILABLE on the first call.
absl::StatusOr<std::shared_ptr<grpc::Channel>> NewChannel(const std::string& address,
                                                          const ChannelOptions& options);

}  // namespace zo

#endif  // ZO_RPC_CHANNEL_H_
