#include "worker/pipeline/tcp_transport.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/host_port.h"
#include "common/status_macros.h"
#include "worker/pipeline/internal/tcp_wire.h"

namespace zo::pipeline {
namespace {

using pipeline_internal::DecodeFrameHeader;
using pipeline_internal::DecodeHelloFixed;
using pipeline_internal::EncodeFrameHeader;
using pipeline_internal::EncodeHello;
using pipeline_internal::FrameHeader;
using pipeline_internal::Hello;
using pipeline_internal::kFrameHeaderBytes;
using pipeline_internal::kHelloFixedBytes;
using pipeline_internal::kMaxJobBytes;
using pipeline_internal::kMaxRank;
using pipeline_internal::kProtocolVersion;

// errno at the socket boundary: a failed connection means "retry the step".
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

void SetNoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int MillisUntil(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

// 0 when `fd` became ready for `events`, else ETIMEDOUT or the errno.
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

// Retries with backoff: the peer process may not listen yet.
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

// Reads exactly n bytes. *eof_at_start tells a clean close between messages
// from one in the middle of a message.
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

// Exchanges handshakes; returns the peer's stage. `expected` < 0 accepts any
// stage (the accepting side learns who called from the handshake).
absl::StatusOr<int> Handshake(int fd, const TcpTransportOptions& o, absl::Time deadline,
                              int expected) {
  const std::string where = expected >= 0
                                ? absl::StrCat("stage ", expected, " at ", o.addresses[expected])
                                : absl::StrCat("the peer connecting from ", PeerName(fd));
  const std::string hello = EncodeHello(Hello{.stages = static_cast<uint32_t>(o.stages),
                                              .stage = static_cast<uint32_t>(o.stage),
                                              .job = o.job});
  const std::string context = absl::StrCat("handshake with ", where, ": ");
  if (absl::Status s = WriteAll(fd, hello.data(), hello.size(), 0); !s.ok()) {
    return Prefix(s, context);
  }
  std::array<std::byte, kHelloFixedBytes> fixed;
  if (absl::Status s = ReadAll(fd, fixed.data(), fixed.size(), deadline, nullptr); !s.ok()) {
    return Prefix(s, context);
  }
  uint32_t job_bytes = 0;
  Hello peer = DecodeHelloFixed(fixed.data(), &job_bytes);
  if (peer.magic != pipeline_internal::kHelloMagic) {
    return absl::DataLossError(absl::StrCat(context, "not a zo pipeline stage (handshake magic 0x",
                                            absl::Hex(peer.magic), ")"));
  }
  if (peer.version != kProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        context, "it speaks pipeline protocol ", peer.version, ", this stage ", kProtocolVersion));
  }
  if (job_bytes > kMaxJobBytes) {
    return absl::DataLossError(absl::StrCat(context, "job name of ", job_bytes, " bytes"));
  }
  peer.job.resize(job_bytes);
  if (absl::Status s = ReadAll(fd, peer.job.data(), job_bytes, deadline, nullptr); !s.ok()) {
    return Prefix(s, context);
  }
  const int peer_stage = static_cast<int>(peer.stage);
  const std::string peer_where =
      expected >= 0 ? absl::StrCat("stage ", peer_stage, " at ", o.addresses[expected])
                    : absl::StrCat("stage ", peer_stage, " (connecting from ", PeerName(fd), ")");
  if (peer.job != o.job || static_cast<int>(peer.stages) != o.stages) {
    return absl::FailedPreconditionError(
        absl::StrCat(peer_where, " runs job '", peer.job, "' with ", peer.stages,
                     " stages; this stage (", o.stage, ") runs job '", o.job, "' with ", o.stages));
  }
  if (expected >= 0 && peer_stage != expected) {
    return absl::FailedPreconditionError(absl::StrCat("the process at ", o.addresses[expected],
                                                      " is stage ", peer_stage, ", expected stage ",
                                                      expected));
  }
  return peer_stage;
}

}  // namespace

struct TcpTransport::Peer {
  int stage = 0;
  std::string address;
  int fd = -1;  // -1: this stage itself (an in-memory queue)
  std::thread reader;

  std::mutex write_mu;
  absl::Status write_status;  // sticky, guarded by write_mu

  std::mutex mu;
  std::condition_variable arrived;
  std::deque<std::pair<MessageTag, backend::Tensor>> queue;  // guarded by mu
  absl::Status read_status;                                  // sticky, guarded by mu

  std::string Name() const { return absl::StrCat("stage ", stage, " at ", address); }
};

TcpTransport::TcpTransport(const TcpTransportOptions& options, backend::Backend& backend)
    : options_(options), backend_(backend) {}

TcpTransport::~TcpTransport() {
  for (auto& peer : peers_) {
    if (peer->fd >= 0) shutdown(peer->fd, SHUT_RDWR);
  }
  for (auto& peer : peers_) {
    if (peer->reader.joinable()) peer->reader.join();
    if (peer->fd >= 0) close(peer->fd);
  }
}

absl::StatusOr<std::unique_ptr<TcpTransport>> TcpTransport::Connect(
    const TcpTransportOptions& options, backend::Backend& backend) {
  const int stages = options.stages;
  const int stage = options.stage;
  if (stages < 1 || stage < 0 || stage >= stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline stage ", stage, " of ", stages, " stages"));
  }
  if (options.addresses.size() != static_cast<size_t>(stages)) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.addresses.size(), " pipeline addresses for ", stages, " stages"));
  }
  if (options.job.size() > kMaxJobBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("job name of ", options.job.size(), " bytes exceeds ", kMaxJobBytes));
  }
  if (options.max_message_bytes < 1) {
    return absl::InvalidArgumentError("max_message_bytes must be positive");
  }
  for (const std::string& address : options.addresses) {
    ZO_RETURN_IF_ERROR(ParseHostPort(address, PortUse::kConnect).status());
  }

  std::unique_ptr<TcpTransport> t(new TcpTransport(options, backend));
  auto self = std::make_unique<Peer>();
  self->stage = stage;
  self->address = options.addresses[stage];
  t->peers_.push_back(std::move(self));

  std::set<int> lower, higher;
  for (int n : {(stage + stages - 1) % stages, (stage + 1) % stages}) {
    if (n < stage) lower.insert(n);
    if (n > stage) higher.insert(n);
  }
  auto add_peer = [&](int peer_stage, ScopedFd fd) {
    SetNoDelay(fd.get());
    auto peer = std::make_unique<Peer>();
    peer->stage = peer_stage;
    peer->address = options.addresses[peer_stage];
    peer->fd = fd.Release();
    t->peers_.push_back(std::move(peer));
  };

  const absl::Time deadline = absl::Now() + options.connect_timeout;
  ScopedFd listener;
  if (!higher.empty()) {
    ZO_ASSIGN_OR_RETURN(listener, Listen(options.addresses[stage]));
  }
  // Dial the lower neighbours first and accept afterwards: stage 0 only
  // accepts, so every dial chain ends there and nobody waits in a cycle.
  for (int n : lower) {
    ZO_ASSIGN_OR_RETURN(ScopedFd fd,
                        Dial(options.addresses[n], deadline, options.connect_timeout, n));
    ZO_ASSIGN_OR_RETURN(int peer_stage, Handshake(fd.get(), options, deadline, n));
    add_peer(peer_stage, std::move(fd));
  }
  while (!higher.empty()) {
    if (const int err = WaitFor(listener.get(), POLLIN, deadline); err != 0) {
      if (err != ETIMEDOUT) return SocketError(err, "waiting for a connection");
      return absl::DeadlineExceededError(
          absl::StrCat("stage(s) ", absl::StrJoin(higher, ", "), " did not connect to this stage (",
                       stage, ") at ", options.addresses[stage], " within ",
                       absl::FormatDuration(options.connect_timeout)));
    }
    ScopedFd fd(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      return SocketError(errno, absl::StrCat("accepting on ", options.addresses[stage]));
    }
    ZO_ASSIGN_OR_RETURN(int peer_stage, Handshake(fd.get(), options, deadline, /*expected=*/-1));
    if (higher.erase(peer_stage) == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stage ", peer_stage, " connected to stage ", stage, " at ", options.addresses[stage],
          ", which expects only its ring neighbours, each once"));
    }
    add_peer(peer_stage, std::move(fd));
  }
  for (auto& peer : t->peers_) {
    if (peer->fd >= 0)
      peer->reader = std::thread([tp = t.get(), p = peer.get()] { tp->ReadLoop(p); });
  }
  return t;
}

TcpTransport::Peer* TcpTransport::FindPeer(int stage) const {
  for (const auto& peer : peers_) {
    if (peer->stage == stage) return peer.get();
  }
  return nullptr;
}

void TcpTransport::ReadLoop(Peer* peer) {
  for (;;) {
    absl::Status s = ReadOneMessage(peer);
    if (s.ok()) continue;
    // Garbage leaves the stream unframed: stop talking to this peer.
    if (s.code() == absl::StatusCode::kDataLoss) shutdown(peer->fd, SHUT_RDWR);
    {
      std::lock_guard<std::mutex> lock(peer->mu);
      peer->read_status = std::move(s);
    }
    peer->arrived.notify_all();
    return;
  }
}

absl::Status TcpTransport::ReadOneMessage(Peer* peer) {
  const std::string from = absl::StrCat("from ", peer->Name(), ": ");
  std::array<std::byte, kFrameHeaderBytes> bytes;
  bool clean_eof = false;
  if (absl::Status s =
          ReadAll(peer->fd, bytes.data(), bytes.size(), absl::InfiniteFuture(), &clean_eof);
      !s.ok()) {
    return absl::UnavailableError(absl::StrCat(peer->Name(), ": ", s.message()));
  }
  absl::StatusOr<FrameHeader> header = DecodeFrameHeader(bytes, options_.max_message_bytes);
  if (!header.ok()) return Prefix(header.status(), from);
  std::vector<std::byte> payload(header->payload_bytes);
  if (absl::Status s =
          ReadAll(peer->fd, payload.data(), payload.size(), absl::InfiniteFuture(), nullptr);
      !s.ok()) {
    return absl::UnavailableError(absl::StrCat(peer->Name(), ": ", s.message()));
  }
  backend::Tensor tensor = backend_.Empty(header->dtype, header->shape);
  if (absl::Status s = backend_.Upload(payload, tensor); !s.ok()) {
    return absl::InternalError(absl::StrCat(from, s.message()));
  }
  {
    std::lock_guard<std::mutex> lock(peer->mu);
    peer->queue.emplace_back(header->tag, std::move(tensor));
  }
  peer->arrived.notify_all();
  return absl::OkStatus();
}

absl::Status TcpTransport::Send(int to, const MessageTag& tag, const backend::Tensor& tensor) {
  Peer* peer = FindPeer(to);
  if (peer == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage ", options_.stage, " cannot send to stage ", to, ": not a ring neighbour"));
  }
  if (!tensor.defined() || tensor.rank() > kMaxRank ||
      tensor.nbytes() > options_.max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot send ", ToString(tag), ": ",
        tensor.defined()
            ? absl::StrCat(std::string(DTypeName(tensor.dtype())), " tensor ",
                           backend::ShapeString(tensor.shape()), " (rank <= ", kMaxRank,
                           ", at most ", options_.max_message_bytes, " bytes)")
            : "undefined tensor"));
  }
  if (peer->fd < 0) {  // to this stage itself
    {
      std::lock_guard<std::mutex> lock(peer->mu);
      peer->queue.emplace_back(tag, tensor);
    }
    peer->arrived.notify_all();
    return absl::OkStatus();
  }
  {
    std::lock_guard<std::mutex> lock(peer->mu);
    if (!peer->read_status.ok()) return peer->read_status;
  }
  std::array<std::byte, kFrameHeaderBytes> header;
  EncodeFrameHeader(
      FrameHeader{tag, tensor.dtype(), tensor.shape(), static_cast<uint64_t>(tensor.nbytes())},
      header.data());
  std::vector<std::byte> payload(static_cast<size_t>(tensor.nbytes()));
  if (absl::Status s = backend_.Download(tensor, absl::MakeSpan(payload)); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(peer->write_mu);
  if (!peer->write_status.ok()) return peer->write_status;
  absl::Status s = WriteAll(peer->fd, header.data(), header.size(), MSG_MORE);
  if (s.ok()) s = WriteAll(peer->fd, payload.data(), payload.size(), 0);
  if (!s.ok()) {
    peer->write_status = absl::UnavailableError(
        absl::StrCat("sending ", ToString(tag), " to ", peer->Name(), ": ", s.message()));
    return peer->write_status;
  }
  return absl::OkStatus();
}

absl::StatusOr<backend::Tensor> TcpTransport::Recv(int from, const MessageTag& tag) {
  Peer* peer = FindPeer(from);
  if (peer == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage ", options_.stage, " cannot receive from stage ", from, ": not a ring neighbour"));
  }
  const auto timeout = std::min(options_.recv_timeout, absl::Hours(24 * 365));
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  std::unique_lock<std::mutex> lock(peer->mu);
  peer->arrived.wait_until(lock, deadline,
                           [&] { return !peer->queue.empty() || !peer->read_status.ok(); });
  if (!peer->queue.empty()) {
    if (!(peer->queue.front().first == tag)) {
      return absl::FailedPreconditionError(absl::StrCat("expected ", ToString(tag), " from ",
                                                        peer->Name(), " but received ",
                                                        ToString(peer->queue.front().first)));
    }
    backend::Tensor tensor = std::move(peer->queue.front().second);
    peer->queue.pop_front();
    return tensor;
  }
  if (!peer->read_status.ok()) return peer->read_status;
  return absl::DeadlineExceededError(absl::StrCat("no message from ", peer->Name(), " within ",
                                                  absl::FormatDuration(options_.recv_timeout),
                                                  " (expected ", ToString(tag), ")"));
}

}  // namespace zo::pipeline
