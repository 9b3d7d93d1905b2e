#include "worker/pipeline/internal/tcp_socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/status_macros.h"

namespace zo::pipeline::pipeline_internal {
namespace {

struct AddrInfoDeleter {
  void operator()(addrinfo* info) const { freeaddrinfo(info); }
};
using AddrInfoList = std::unique_ptr<addrinfo, AddrInfoDeleter>;

absl::StatusOr<AddrInfoList> Resolve(const std::string& address, bool passive) {
  // Every stage's address is also where its neighbours connect: port 0 would
  // leave them nowhere to go.
  ZO_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(address, PortUse::kConnect));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* list = nullptr;
  // "*" listens on every address. (Compared by size and byte: GCC 12 warns
  // falsely of an uninitialised read in operator== through the StatusOr move.)
  const bool any_host = hp.host.size() == 1 && hp.host[0] == '*';
  const char* host = any_host ? nullptr : hp.host.c_str();
  const std::string port = std::to_string(hp.port);
  if (const int rc = getaddrinfo(host, port.c_str(), &hints, &list); rc != 0) {
    return absl::UnavailableError(absl::StrCat("resolving '", address, "': ", gai_strerror(rc)));
  }
  return AddrInfoList(list);
}

int MillisUntil(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

// One non-blocking connect attempt to each resolved address, waiting at most
// until `deadline`.
absl::StatusOr<ScopedFd> TryConnect(const std::string& address, absl::Time deadline) {
  ZO_ASSIGN_OR_RETURN(AddrInfoList list, Resolve(address, /*passive=*/false));
  int last_error = EADDRNOTAVAIL;
  for (addrinfo* ai = list.get(); ai != nullptr; ai = ai->ai_next) {
    ScopedFd fd(
        socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    if (fd.get() < 0) {
      last_error = errno;
      continue;
    }
    int err = 0;
    if (connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        err = WaitFor(fd.get(), POLLOUT, deadline);
        socklen_t len = sizeof(err);
        if (err == 0 && getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      }
    }
    if (err == 0) {
      fcntl(fd.get(), F_SETFL, fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
      return fd;
    }
    last_error = err;
  }
  return SocketError(last_error, absl::StrCat("connecting to ", address));
}

}  // namespace

absl::Status SocketError(int err, absl::string_view context) {
  const std::string message = absl::StrCat(context, ": ", std::strerror(err));
  switch (err) {
    case EADDRINUSE:
    case EADDRNOTAVAIL:
    case EACCES:
    case EPERM:
      return absl::FailedPreconditionError(message);
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case ENOBUFS:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::UnavailableError(message);
  }
}

void SetNoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int WaitFor(int fd, short events, absl::Time deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, MillisUntil(deadline));
    if (rc > 0) return 0;
    if (rc == 0) return ETIMEDOUT;
    if (errno != EINTR) return errno;
  }
}

absl::StatusOr<ScopedFd> Listen(const std::string& address) {
  ZO_ASSIGN_OR_RETURN(AddrInfoList list, Resolve(address, /*passive=*/true));
  int last_error = EADDRNOTAVAIL;
  for (addrinfo* ai = list.get(); ai != nullptr; ai = ai->ai_next) {
    ScopedFd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (fd.get() < 0) {
      last_error = errno;
      continue;
    }
    const int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd.get(), 16) == 0) return fd;
    last_error = errno;
  }
  return SocketError(last_error, absl::StrCat("listening on ", address));
}

absl::StatusOr<ScopedFd> Dial(const std::string& address, absl::Time deadline,
                              absl::Duration timeout, int peer) {
  absl::Duration backoff = absl::Milliseconds(10);
  for (;;) {
    absl::StatusOr<ScopedFd> fd = TryConnect(address, deadline);
    if (fd.ok() || fd.status().code() == absl::StatusCode::kInvalidArgument) return fd;
    if (absl::Now() + backoff >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("stage ", peer, " did not accept a connection at ", address, " within ",
                       absl::FormatDuration(timeout), "; last error: ", fd.status().message()));
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

absl::Status WriteAll(int fd, const void* data, size_t n, int flags) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t sent = send(fd, p, n, MSG_NOSIGNAL | flags);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return SocketError(errno, "send");
    }
    p += sent;
    n -= static_cast<size_t>(sent);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, void* data, size_t n, absl::Time deadline, bool* eof_at_start) {
  char* p = static_cast<char*>(data);
  const size_t want = n;
  if (eof_at_start != nullptr) *eof_at_start = false;
  while (n > 0) {
    if (deadline != absl::InfiniteFuture()) {
      if (const int err = WaitFor(fd, POLLIN, deadline); err != 0) {
        if (err == ETIMEDOUT) return absl::DeadlineExceededError("timed out reading");
        return SocketError(err, "poll");
      }
    }
    const ssize_t got = recv(fd, p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return SocketError(errno, "recv");
    }
    if (got == 0) {
      if (eof_at_start != nullptr) *eof_at_start = n == want;
      return absl::UnavailableError(n == want ? "closed the connection"
                                              : "closed the connection in the middle of a message");
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::Status Prefix(const absl::Status& s, absl::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

std::string PeerName(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  char host[NI_MAXHOST];
  char port[NI_MAXSERV];
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), port, sizeof(port),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown address";
  }
  return absl::StrCat(host, ":", port);
}

}  // namespace zo::pipeline::pipeline_internal
