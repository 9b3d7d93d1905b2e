// The TCP transport's sockets (tcp_transport.h): listening, dialling with
// retries, and whole reads and writes, errno wrapped into absl::Status at
// this boundary.
#ifndef ZO_WORKER_PIPELINE_INTERNAL_TCP_SOCKET_H_
#define ZO_WORKER_PIPELINE_INTERNAL_TCP_SOCKET_H_

#include <unistd.h>

#include <cstddef>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace zo::pipeline::pipeline_internal {

// errno at the socket boundary: a failed connection means "retry the step".
absl::Status SocketError(int err, absl::string_view context);

// `s` with `prefix` before its message.
absl::Status Prefix(const absl::Status& s, absl::string_view prefix);

// Owns a descriptor and closes it.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~ScopedFd() { Reset(); }

  int get() const { return fd_; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// A socket listening on `address` ("host:port"; host "*": every address).
absl::StatusOr<ScopedFd> Listen(const std::string& address);

// A connected, blocking socket to `address`. Retries with backoff until
// `deadline`: the peer process may not listen yet. DEADLINE_EXCEEDED then
// names stage `peer` and `timeout`.
absl::StatusOr<ScopedFd> Dial(const std::string& address, absl::Time deadline,
                              absl::Duration timeout, int peer);

void SetNoDelay(int fd);

// 0 when `fd` became ready for `events`, else ETIMEDOUT or the errno.
int WaitFor(int fd, short events, absl::Time deadline);

// Sends all `n` bytes (with send flags `flags`; never raises SIGPIPE).
absl::Status WriteAll(int fd, const void* data, size_t n, int flags);

// Reads exactly n bytes, waiting at most until `deadline` (InfiniteFuture:
// blocks). *eof_at_start (may be null) tells a clean close between messages
// from one in the middle of a message.
absl::Status ReadAll(int fd, void* data, size_t n, absl::Time deadline, bool* eof_at_start);

// The peer's "host:port", or "an unknown address".
std::string PeerName(int fd);

}  // namespace zo::pipeline::pipeline_internal

#endif  // ZO_WORKER_PIPELINE_INTERNAL_TCP_SOCKET_H_
