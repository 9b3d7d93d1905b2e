// How a peer that stopped answering is noticed: the pings every channel
// zo opens sends (rpc/channel.h) and what zo-server accepts of them
// (server/offload_server.h).
#ifndef ZO_RPC_PINGS_H_
#define ZO_RPC_PINGS_H_

#include <algorithm>
#include <cstdint>

#include "absl/time/time.h"

namespace zo {

// A caller waiting for a reply sends nothing, so TCP alone never learns
// that the server's host went down, or that the server dropped the
// connection while a cable was out (its side gives up on unacknowledged
// bytes after 20 s, gRPC's TCP_USER_TIMEOUT, and the reset it sends is
// lost): the call would wait forever. While calls are open, a channel
// therefore pings every ChannelOptions::ping_every (gRPC: at most once a
// second) and closes the connection when a ping, or any byte it sent, is not
// acknowledged within ping_answered_within; the calls then fail UNAVAILABLE.
// A live server answers a ping from its transport, whatever its optimizer is
// doing.
inline constexpr absl::Duration kPingEvery = absl::Seconds(10);
inline constexpr absl::Duration kPingAnsweredWithin = absl::Seconds(20);
// What a server accepts: pings this often without data between them. With
// gRPC's default (one per 5 min, two strikes) a worker's wait would end
// after a few pings in GOAWAY "too many pings" (server/pings_test.cc).
inline constexpr absl::Duration kPingsAcceptedEvery = absl::Seconds(5);  // kPingEvery / 2

// One of the durations above as gRPC's channel arguments take it: int ms.
inline int PingArgMs(absl::Duration d) {
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d), INT32_MAX));
}

}  // namespace zo

#endif  // ZO_RPC_PINGS_H_
