#include "common/metrics_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "prometheus/collectable.h"
#include "prometheus/text_serializer.h"

namespace zo {
namespace {

// A request line and headers larger than this are not a scrape.
constexpr size_t kMaxRequestBytes = 8192;
// A client that sends nothing for this long is dropped, so one stuck
// connection cannot hold the endpoint (answers are serial).
constexpr int kClientTimeoutMs = 5000;

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, kClientTimeoutMs) <= 0) return false;
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

std::string Response(const char* status, const char* content_type, const std::string& body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

absl::StatusOr<int> Listen(const HostPort& hp, const std::string& listen, int* port) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = AF_INET;
  if (auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
      ::inet_pton(AF_INET, hp.host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(hp.port));
    len = sizeof(sockaddr_in);
  } else if (auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
             ::inet_pton(AF_INET6, hp.host.c_str(), &v6->sin6_addr) == 1) {
    family = AF_INET6;
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(hp.port));
    len = sizeof(sockaddr_in6);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address ", listen, ": the host must be a numeric address (e.g. 0.0.0.0)"));
  }
  const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd, 16) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", listen, ": ", std::strerror(err)));
  }
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&addr)->sin_port
                                  : reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return fd;
}

}  // namespace

MetricsEndpoint::MetricsEndpoint(int listen_fd, int stop_fd, int port, std::string url,
                                 std::vector<std::shared_ptr<prometheus::Collectable>> from)
    : listen_fd_(listen_fd),
      stop_fd_(stop_fd),
      port_(port),
      url_(std::move(url)),
      from_(std::move(from)),
      thread_([this] { Serve(); }) {}

MetricsEndpoint::~MetricsEndpoint() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(stop_fd_, &one, sizeof(one));
  thread_.join();
  ::close(listen_fd_);
  ::close(stop_fd_);
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& listen, std::vector<std::shared_ptr<prometheus::Collectable>> from) {
  ZO_ASSIGN_OR_RETURN(const HostPort hp, ParseHostPort(listen, PortUse::kListen));
  int port = 0;
  ZO_ASSIGN_OR_RETURN(const int fd, Listen(hp, listen, &port));
  const int stop = ::eventfd(0, EFD_CLOEXEC);
  if (stop < 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  std::string url =
      absl::StrCat("http://", FormatHostPort({.host = hp.host, .port = port}), "/metrics");
  return std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(fd, stop, port, std::move(url), std::move(from)));
}

void MetricsEndpoint::Serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      ZO_LOG(ERROR) << "metrics endpoint: poll: " << std::strerror(errno);
      return;
    }
    if (fds[1].revents != 0) return;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;  // the peer left already, or a transient error
    Answer(fd);
    ::close(fd);
  }
}

void MetricsEndpoint::Answer(int fd) {
  std::string request;
  char buf[1024];
  while (!absl::StrContains(request, "\r\n\r\n") && !absl::StrContains(request, "\n\n")) {
    if (request.size() > kMaxRequestBytes) {
      SendAll(fd, Response("431 Request Header Fields Too Large", "text/plain", "too large\n"));
      return;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, kClientTimeoutMs) <= 0) return;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;
    request.append(buf, static_cast<size_t>(n));
  }
  const std::string line = request.substr(0, request.find_first_of("\r\n"));
  if (!absl::StartsWith(line, "GET ") && !absl::StartsWith(line, "HEAD ")) {
    SendAll(fd, Response("405 Method Not Allowed", "text/plain", "only GET /metrics\n"));
    return;
  }
  const size_t path_start = line.find(' ') + 1;
  std::string path = line.substr(path_start, line.find(' ', path_start) - path_start);
  path = path.substr(0, path.find('?'));
  if (path != "/metrics" && path != "/") {
    SendAll(fd, Response("404 Not Found", "text/plain", "metrics are at /metrics\n"));
    return;
  }
  std::string response = Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", Body());
  if (absl::StartsWith(line, "HEAD ")) response.resize(response.find("\r\n\r\n") + 4);
  SendAll(fd, response);
}

std::string MetricsEndpoint::Body() const {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& c : from_) {
    std::vector<prometheus::MetricFamily> part = c->Collect();
    families.insert(families.end(), std::make_move_iterator(part.begin()),
                    std::make_move_iterator(part.end()));
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

}  // namespace zo
