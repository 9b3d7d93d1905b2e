#include "bench/internal/tcp_stream.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "offload/io/io_error.h"

namespace zo::bench_internal {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

// As gRPC does on its sockets; only the final acknowledgement would wait
// for Nagle otherwise.
void SetNoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

absl::Status SendAll(int fd, const std::byte* data, size_t n, size_t write_bytes) {
  while (n > 0) {
    const ssize_t sent = send(fd, data, std::min(n, write_bytes), MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return ZO_ERRNO_STATUS(errno, "send to the TCP sink");
    }
    data += sent;
    n -= static_cast<size_t>(sent);
  }
  return absl::OkStatus();
}

// Reads exactly n bytes; false on end of stream or an error.
bool RecvAll(int fd, void* dst, size_t n) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpSink>> TcpSink::Start(size_t read_bytes) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ZO_ERRNO_STATUS(errno, "socket for the TCP sink");
  sockaddr_in addr = Loopback(0);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 4) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    close(fd);
    return ZO_ERRNO_STATUS(err, "listen on 127.0.0.1 for the TCP sink");
  }
  return std::unique_ptr<TcpSink>(new TcpSink(fd, ntohs(addr.sin_port), read_bytes));
}

TcpSink::TcpSink(int listen_fd, int port, size_t read_bytes)
    : listen_fd_(listen_fd),
      port_(port),
      read_bytes_(std::max<size_t>(read_bytes, 1)),
      thread_([this] { Run(); }) {}

TcpSink::~TcpSink() {
  Stop();
  close(listen_fd_);
}

void TcpSink::Stop() {
  if (stop_.exchange(true)) return;
  shutdown(listen_fd_, SHUT_RDWR);                                       // wakes accept()
  if (const int fd = conn_fd_.load(); fd >= 0) shutdown(fd, SHUT_RDWR);  // wakes recv()
  thread_.join();
}

void TcpSink::Run() {
  while (!stop_.load()) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down by Stop
    }
    SetNoDelay(fd);
    conn_fd_.store(fd);
    if (!stop_.load()) Serve(fd);
    conn_fd_.store(-1);
    close(fd);
  }
}

void TcpSink::Serve(int fd) {
  std::vector<char> buffer(read_bytes_);
  for (;;) {
    unsigned char header[8];
    if (!RecvAll(fd, header, sizeof(header))) return;
    uint64_t left = 0;
    for (int i = 7; i >= 0; --i) left = (left << 8) | header[i];
    while (left > 0) {
      const ssize_t got = recv(fd, buffer.data(), std::min<uint64_t>(left, buffer.size()), 0);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return;
      left -= static_cast<uint64_t>(got);
    }
    const char ack = 1;
    if (send(fd, &ack, 1, MSG_NOSIGNAL) != 1) return;
  }
}

absl::StatusOr<std::unique_ptr<TcpSender>> TcpSender::Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ZO_ERRNO_STATUS(errno, "socket for the TCP sender");
  sockaddr_in addr = Loopback(port);
  while (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    close(fd);
    return ZO_ERRNO_STATUS(err, absl::StrCat("connect to the TCP sink at 127.0.0.1:", port));
  }
  SetNoDelay(fd);
  return std::unique_ptr<TcpSender>(new TcpSender(fd));
}

TcpSender::~TcpSender() { close(fd_); }

absl::Status TcpSender::SendRound(absl::Span<const std::byte> data, size_t write_bytes) {
  std::byte header[8];
  uint64_t n = data.size();
  for (std::byte& b : header) {
    b = static_cast<std::byte>(n & 0xff);
    n >>= 8;
  }
  ZO_RETURN_IF_ERROR(SendAll(fd_, header, sizeof(header), sizeof(header)));
  ZO_RETURN_IF_ERROR(SendAll(fd_, data.data(), data.size(), std::max<size_t>(write_bytes, 1)));
  char ack = 0;
  if (!RecvAll(fd_, &ack, 1)) {
    return absl::UnavailableError("the TCP sink closed the connection before acknowledging");
  }
  return absl::OkStatus();
}

}  // namespace zo::bench_internal
