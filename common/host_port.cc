#include "common/host_port.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace zo {

std::string HostPortRule(PortUse use) {
  return use == PortUse::kConnect
             ? "host:port (\"[address]:port\" for IPv6) with a port in [1, 65535]"
             : "host:port (\"[address]:port\" for IPv6) with a port in [0, 65535] (0: any free "
               "port)";
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address, PortUse use) {
  absl::string_view host;
  absl::string_view port;
  bool parsed = false;
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find("]:");
    if (close != absl::string_view::npos) {
      host = address.substr(1, close - 1);
      port = address.substr(close + 2);
      parsed = true;
    }
  } else if (const size_t colon = address.rfind(':'); colon != absl::string_view::npos) {
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    parsed = host.find(':') == absl::string_view::npos;  // a bare IPv6 address is ambiguous
  }
  const bool host_ok = !host.empty() && std::none_of(host.begin(), host.end(), [](char c) {
    return absl::ascii_isspace(static_cast<unsigned char>(c)) || c == '/' || c == '[' || c == ']';
  });
  // Digits only: SimpleAtoi would also take "+80" and " 80".
  const bool digits =
      !port.empty() && port.size() <= 5 &&
      std::all_of(port.begin(), port.end(), [](char c) { return absl::ascii_isdigit(c); });
  int number = -1;
  if (digits && !absl::SimpleAtoi(port, &number)) number = -1;
  const int min_port = use == PortUse::kConnect ? 1 : 0;
  if (!parsed || !host_ok || number < min_port || number > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not ", HostPortRule(use)));
  }
  return HostPort{.host = std::string(host), .port = number};
}

std::string FormatHostPort(const HostPort& hp) {
  if (hp.host.find(':') != std::string::npos) return absl::StrCat("[", hp.host, "]:", hp.port);
  return absl::StrCat(hp.host, ":", hp.port);
}

}  // namespace zo
