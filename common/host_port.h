// The one parser of "host:port" addresses: zo.servers, zo-ctl --server,
// zo-server --listen, the pipeline stages' TCP addresses and every gRPC
// channel go through it, so they all accept and refuse the same strings.
//
//   ZO_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort("[::1]:7070", PortUse::kConnect));
//   // hp.host == "::1", hp.port == 7070
#ifndef ZO_COMMON_HOST_PORT_H_
#define ZO_COMMON_HOST_PORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zo {

struct HostPort {
  std::string host;  // without the brackets of an IPv6 address
  int port = 0;
};

// Port 0 asks the kernel for a free port: it means something to a socket
// that listens and nothing to one that connects.
enum class PortUse {
  kConnect,  // port in [1, 65535]
  kListen,   // port in [0, 65535]; 0 picks a free one
};

// The rule, for error messages: "host:port (\"[address]:port\" for IPv6)
// with a port in [1, 65535]" (or [0, 65535] ... for kListen).
std::string HostPortRule(PortUse use);

// `address` as "host:port" or "[IPv6 address]:port": a non-empty host
// without blanks, '/' or brackets (an IPv6 address goes in brackets, a bare
// one is ambiguous) and a decimal port in the range of `use`.
// INVALID_ARGUMENT "'<address>' is not <HostPortRule(use)>" otherwise.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address, PortUse use);

// "host:port", with brackets when the host is an IPv6 address.
std::string FormatHostPort(const HostPort& hp);

}  // namespace zo

#endif  // ZO_COMMON_HOST_PORT_H_
