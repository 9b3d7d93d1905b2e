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
#include <fstream>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/host_port.h"
#include "common/status_macros.h"
#include "worker/backend/device_link.h"
#include "worker/backend/device_sharing.h"
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
using pipeline_internal::kMaxHelloFieldBytes;
using pipeline_internal::kMaxInboxSlots;
using pipeline_internal::kMaxJobBytes;
using pipeline_internal::kMaxRank;
using pipeline_internal::kOnLink;
using pipeline_internal::kProtocolVersion;

// The header announcing `tensor`: over the socket (slot -1, its payload
// follows), in an inbox slot, or on the device link (kOnLink).
FrameHeader TensorHeader(const MessageTag& tag, const backend::Tensor& tensor, int slot = -1) {
  return FrameHeader{.tag = tag,
                     .dtype = tensor.dtype(),
                     .shape = tensor.shape(),
                     .payload_bytes = static_cast<uint64_t>(tensor.nbytes()),
                     .slot = slot};
}

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

// The link field's mark of a stage that wants a device link even on its host.
constexpr absl::string_view kPrefer = ";prefer";

// What tells two processes they share a machine (and so may map each
// other's memory): the kernel's boot id, else the host name.
std::string HostIdentity() {
  std::ifstream boot_id("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (boot_id >> id && !id.empty()) return id;
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return absl::StrCat("host:", name);
}

// Reads a u32 length and that many bytes (at most `limit`).
absl::Status ReadField(int fd, absl::Time deadline, size_t limit, const char* what,
                       std::string* out) {
  std::array<std::byte, 4> length;
  ZO_RETURN_IF_ERROR(ReadAll(fd, length.data(), length.size(), deadline, nullptr));
  const uint32_t bytes = pipeline_internal::DecodeU32(length.data());
  if (bytes > limit) return absl::DataLossError(absl::StrCat(what, " of ", bytes, " bytes"));
  out->resize(bytes);
  return ReadAll(fd, out->data(), bytes, deadline, nullptr);
}

// Exchanges handshakes, saying what this stage can share and link (or
// empty); returns the peer's. `expected` < 0 accepts any stage (the
// accepting side learns who called from the handshake).
absl::StatusOr<Hello> Handshake(int fd, const TcpTransportOptions& o, absl::Time deadline,
                                int expected, const std::string& host, const std::string& sharing,
                                const std::string& link) {
  const std::string where = expected >= 0
                                ? absl::StrCat("stage ", expected, " at ", o.addresses[expected])
                                : absl::StrCat("the peer connecting from ", PeerName(fd));
  const std::string hello = EncodeHello(Hello{.stages = static_cast<uint32_t>(o.stages),
                                              .stage = static_cast<uint32_t>(o.stage),
                                              .job = o.job,
                                              .host = host,
                                              .sharing = sharing,
                                              .link = link});
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
  absl::Status read = ReadAll(fd, peer.job.data(), job_bytes, deadline, nullptr);
  if (read.ok()) read = ReadField(fd, deadline, kMaxHelloFieldBytes, "host field", &peer.host);
  if (read.ok()) {
    read = ReadField(fd, deadline, kMaxHelloFieldBytes, "sharing field", &peer.sharing);
  }
  if (read.ok()) read = ReadField(fd, deadline, kMaxHelloFieldBytes, "link field", &peer.link);
  if (!read.ok()) return Prefix(read, context);
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
  return peer;
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

  // Memory shared with this peer (both null on the socket route).
  std::unique_ptr<backend::Inbox> inbox;       // ours, the peer Puts into it
  std::unique_ptr<backend::PeerInbox> outbox;  // the peer's, mapped here
  std::unique_ptr<backend::DeviceLink> link;   // both ways, when joined
  std::string route;
  std::mutex put_mu;  // one Put at a time into the outbox
  std::condition_variable slot_freed;
  std::vector<int> free_slots;             // of the outbox; guarded by mu
  std::vector<backend::Tensor> in_flight;  // by outbox slot, kept until its credit; guarded by mu

  std::string Name() const { return absl::StrCat("stage ", stage, " at ", address); }

  // Writes a header that carries no payload (its tensor is in an inbox or
  // on the link, or it is a credit); write_mu held. A failure is sticky.
  absl::Status WriteHeaderLocked(const FrameHeader& h) {
    if (!write_status.ok()) return write_status;
    std::array<std::byte, kFrameHeaderBytes> bytes;
    EncodeFrameHeader(h, bytes.data());
    if (absl::Status s = WriteAll(fd, bytes.data(), bytes.size(), 0); !s.ok()) {
      write_status = absl::UnavailableError(
          absl::StrCat(h.credit ? absl::StrCat("returning inbox slot ", h.slot, " to ")
                                : absl::StrCat("sending ", ToString(h.tag), " to "),
                       Name(), ": ", s.message()));
    }
    return write_status;
  }
};

TcpTransport::TcpTransport(const TcpTransportOptions& options, backend::Backend& backend)
    : options_(options), backend_(backend), credit_writer_(std::make_unique<WakeQueue>()) {}

TcpTransport::~TcpTransport() {
  closing_ = true;  // the readers' failures below are ours, not the peers'
  for (auto& peer : peers_) {
    if (peer->fd >= 0) shutdown(peer->fd, SHUT_RDWR);
  }
  for (auto& peer : peers_) {
    if (peer->reader.joinable()) peer->reader.join();
  }
  credit_writer_.reset();  // its writes fail now; then the descriptors may go
  for (auto& peer : peers_) {
    if (peer->fd >= 0) close(peer->fd);
  }
}

namespace {

absl::Status CheckConnectOptions(const TcpTransportOptions& options) {
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
  if (options.share_memory && (options.inbox_slots < 1 || options.inbox_slots > kMaxInboxSlots ||
                               options.inbox_slot_bytes < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("an inbox of ", options.inbox_slots,
                                                   " slots of ", options.inbox_slot_bytes,
                                                   " bytes (1 to ", kMaxInboxSlots, " slots)"));
  }
  for (const std::string& address : options.addresses) {
    ZO_RETURN_IF_ERROR(ParseHostPort(address, PortUse::kConnect).status());
  }
  return absl::OkStatus();
}

}  // namespace

// Connect's steps: the handshake with each ring neighbour (dialling the
// lower ones, accepting the higher), then how tensors will travel to it.
class TcpTransport::Connector {
 public:
  Connector(TcpTransport& t, backend::Backend& backend)
      : t_(t),
        o_(t.options_),
        backend_(backend),
        deadline_(absl::Now() + o_.connect_timeout),
        host_(HostIdentity()),
        sharing_(o_.share_memory ? backend.sharing() : nullptr),
        links_(o_.device_links ? backend.links() : nullptr),
        // The handshake's sharing and link fields say what this stage can
        // do; inboxes and a link's offer are made only once both sides have
        // chosen them (an inbox is device memory on a GPU, an NCCL offer a
        // bootstrap listener).
        sharing_kind_(sharing_ != nullptr ? backend.name() : std::string()),
        link_kind_(links_ == nullptr
                       ? std::string()
                       : absl::StrCat(backend.name(), o_.prefer_device_link ? kPrefer : "")) {}

  // Dials the lower neighbours first and accepts afterwards: stage 0 only
  // accepts, so every dial chain ends there and nobody waits in a cycle.
  absl::Status ConnectNeighbours() {
    std::set<int> lower, higher;
    for (int n : {(o_.stage + o_.stages - 1) % o_.stages, (o_.stage + 1) % o_.stages}) {
      if (n < o_.stage) lower.insert(n);
      if (n > o_.stage) higher.insert(n);
    }
    ScopedFd listener;
    if (!higher.empty()) {
      ZO_ASSIGN_OR_RETURN(listener, Listen(o_.addresses[o_.stage]));
    }
    for (int n : lower) {
      ZO_ASSIGN_OR_RETURN(ScopedFd fd, Dial(o_.addresses[n], deadline_, o_.connect_timeout, n));
      ZO_ASSIGN_OR_RETURN(Hello hello,
                          Handshake(fd.get(), o_, deadline_, n, host_, sharing_kind_, link_kind_));
      ZO_RETURN_IF_ERROR(AddPeer(hello, std::move(fd)));
    }
    while (!higher.empty()) ZO_RETURN_IF_ERROR(AcceptOne(listener.get(), higher));
    return absl::OkStatus();
  }

 private:
  // Accepts one of `higher` (removed from it once it said hello).
  absl::Status AcceptOne(int listener, std::set<int>& higher) {
    const int stage = o_.stage;
    if (const int err = WaitFor(listener, POLLIN, deadline_); err != 0) {
      if (err != ETIMEDOUT) return SocketError(err, "waiting for a connection");
      return absl::DeadlineExceededError(absl::StrCat(
          "stage(s) ", absl::StrJoin(higher, ", "), " did not connect to this stage (", stage,
          ") at ", o_.addresses[stage], " within ", absl::FormatDuration(o_.connect_timeout)));
    }
    ScopedFd fd(accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) return absl::OkStatus();
      return SocketError(errno, absl::StrCat("accepting on ", o_.addresses[stage]));
    }
    ZO_ASSIGN_OR_RETURN(Hello hello, Handshake(fd.get(), o_, deadline_, /*expected=*/-1, host_,
                                               sharing_kind_, link_kind_));
    const int peer_stage = static_cast<int>(hello.stage);
    if (higher.erase(peer_stage) == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("stage ", peer_stage, " connected to stage ", stage, " at ",
                       o_.addresses[stage], ", which expects only its ring neighbours, each once"));
    }
    return AddPeer(hello, std::move(fd));
  }

  // Decides the route to the neighbour that said `hello` (both sides decide
  // alike: each knows whether both can, and whether either prefers a link)
  // and sets it up.
  absl::Status AddPeer(const Hello& hello, ScopedFd fd) {
    SetNoDelay(fd.get());
    auto peer = std::make_unique<Peer>();
    peer->stage = static_cast<int>(hello.stage);
    peer->address = o_.addresses[peer->stage];
    const bool same_host = hello.host == host_;
    const bool prefer_link = o_.prefer_device_link || absl::EndsWith(hello.link, kPrefer);
    if (links_ != nullptr && !hello.link.empty() && (!same_host || prefer_link)) {
      ZO_ASSIGN_OR_RETURN(peer->link, JoinLink(fd.get(), peer->stage));
      peer->route = absl::StrCat("a device link (", backend_.name(), " to ",
                                 absl::StripSuffix(hello.link, kPrefer), ")");
    } else if (!same_host) {
      peer->route = "the socket (the peer runs on another host)";
    } else if (sharing_ == nullptr) {
      peer->route = o_.share_memory
                        ? absl::StrCat("the socket (", backend_.name(), " shares no memory)")
                        : std::string("the socket (share_memory is off)");
    } else if (hello.sharing.empty()) {
      peer->route = "the socket (the peer shares no memory)";
    } else {
      ZO_RETURN_IF_ERROR(ShareInboxes(fd.get(), *peer));
    }
    peer->fd = fd.Release();
    t_.peers_.push_back(std::move(peer));
    return absl::OkStatus();
  }

  // The lower stage makes the link's offer and sends it; both join it.
  absl::StatusOr<std::unique_ptr<backend::DeviceLink>> JoinLink(int fd, int peer_stage) {
    const std::string context = absl::StrCat("device link with stage ", peer_stage, ": ");
    std::string link_offer;
    if (o_.stage < peer_stage) {
      absl::StatusOr<std::string> made = links_->Offer();
      if (!made.ok()) return Prefix(made.status(), context);
      link_offer = *std::move(made);
      const std::string field = pipeline_internal::EncodeField(link_offer);
      if (absl::Status s = WriteAll(fd, field.data(), field.size(), 0); !s.ok()) {
        return Prefix(s, context);
      }
    } else if (absl::Status s =
                   ReadField(fd, deadline_, kMaxHelloFieldBytes, "link offer", &link_offer);
               !s.ok()) {
      return Prefix(s, context);
    }
    absl::StatusOr<std::unique_ptr<backend::DeviceLink>> link =
        links_->Join(link_offer, o_.stage < peer_stage ? 0 : 1);
    if (!link.ok()) return Prefix(link.status(), context);
    return link;
  }

  // Each side sends its inbox's handle and reads the peer's (a few hundred
  // bytes each way: writing first cannot block), maps the peer's, then says
  // whether it did; an inbox the peer could not map is freed at once.
  absl::Status ShareInboxes(int fd, Peer& peer) {
    const std::string context = absl::StrCat("inboxes with stage ", peer.stage, ": ");
    std::unique_ptr<backend::Inbox> inbox;
    if (absl::StatusOr<std::unique_ptr<backend::Inbox>> made =
            sharing_->CreateInbox(o_.inbox_slots, o_.inbox_slot_bytes);
        made.ok()) {
      inbox = *std::move(made);
    }
    const std::string mine = pipeline_internal::EncodeField(inbox ? inbox->handle() : "");
    std::string theirs;
    absl::Status s = WriteAll(fd, mine.data(), mine.size(), 0);
    if (s.ok()) s = ReadField(fd, deadline_, kMaxHelloFieldBytes, "inbox handle", &theirs);
    if (!s.ok()) return Prefix(s, context);
    if (theirs.empty()) {
      peer.route = "the socket (the peer could not allocate an inbox)";
    } else if (absl::StatusOr<std::unique_ptr<backend::PeerInbox>> outbox =
                   sharing_->OpenPeerInbox(theirs);
               !outbox.ok()) {
      peer.route = absl::StrCat("the socket (", outbox.status().message(), ")");
    } else {
      peer.outbox = *std::move(outbox);
      peer.in_flight.resize(static_cast<size_t>(peer.outbox->slots()));
      for (int slot = peer.outbox->slots(); slot-- > 0;) peer.free_slots.push_back(slot);
      peer.route = absl::StrCat("shared memory (", backend_.name(), ")");
    }
    const char mapped = peer.outbox != nullptr ? 1 : 0;
    char peer_mapped = 0;
    s = WriteAll(fd, &mapped, 1, 0);
    if (s.ok()) s = ReadAll(fd, &peer_mapped, 1, deadline_, nullptr);
    if (!s.ok()) return Prefix(s, context);
    if (peer_mapped == 1) peer.inbox = std::move(inbox);
    return absl::OkStatus();
  }

  TcpTransport& t_;
  const TcpTransportOptions& o_;
  backend::Backend& backend_;
  const absl::Time deadline_;
  const std::string host_;
  backend::DeviceSharing* const sharing_;
  backend::DeviceLinks* const links_;
  const std::string sharing_kind_;
  const std::string link_kind_;
};

absl::StatusOr<std::unique_ptr<TcpTransport>> TcpTransport::Connect(
    const TcpTransportOptions& options, backend::Backend& backend) {
  ZO_RETURN_IF_ERROR(CheckConnectOptions(options));
  std::unique_ptr<TcpTransport> t(new TcpTransport(options, backend));
  auto self = std::make_unique<Peer>();
  self->stage = options.stage;
  self->address = options.addresses[options.stage];
  t->peers_.push_back(std::move(self));
  ZO_RETURN_IF_ERROR(Connector(*t, backend).ConnectNeighbours());
  for (auto& peer : t->peers_) {
    if (peer->fd >= 0) {
      peer->reader = std::thread([tp = t.get(), p = peer.get()] { tp->ReadLoop(p); });
    }
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
    if (options_.on_peer_lost && !closing_.load()) options_.on_peer_lost(peer->stage, s);
    {
      std::lock_guard<std::mutex> lock(peer->mu);
      peer->read_status = std::move(s);
    }
    peer->arrived.notify_all();
    peer->slot_freed.notify_all();
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
  if (header->credit) {
    backend::Tensor sent;  // dropped outside the lock
    {
      std::lock_guard<std::mutex> lock(peer->mu);
      const int slot = header->slot;
      if (peer->outbox == nullptr || slot >= static_cast<int>(peer->in_flight.size()) ||
          !peer->in_flight[static_cast<size_t>(slot)].defined()) {
        return absl::DataLossError(
            absl::StrCat(from, "a credit for slot ", slot, ", which holds nothing sent to it"));
      }
      sent = std::move(peer->in_flight[static_cast<size_t>(slot)]);
      peer->in_flight[static_cast<size_t>(slot)] = backend::Tensor();
      peer->free_slots.push_back(slot);
    }
    peer->slot_freed.notify_all();
    return absl::OkStatus();
  }
  if (header->slot == kOnLink) {
    if (peer->link == nullptr) {
      return absl::DataLossError(absl::StrCat(from, "a message on a device link never joined"));
    }
    absl::StatusOr<backend::Tensor> tensor = peer->link->Recv(header->dtype, header->shape);
    if (!tensor.ok()) return Prefix(tensor.status(), from);
    {
      std::lock_guard<std::mutex> lock(peer->mu);
      peer->queue.emplace_back(header->tag, *std::move(tensor));
    }
    peer->arrived.notify_all();
    return absl::OkStatus();
  }
  if (header->slot >= 0) {
    if (peer->inbox == nullptr) {
      return absl::DataLossError(
          absl::StrCat(from, "a message in inbox slot ", header->slot, ", but none was offered"));
    }
    absl::StatusOr<backend::Tensor> tensor =
        peer->inbox->Take(header->slot, header->dtype, header->shape);
    if (!tensor.ok()) return Prefix(tensor.status(), from);
    ReturnCredit(peer, header->slot);
    {
      std::lock_guard<std::mutex> lock(peer->mu);
      peer->queue.emplace_back(header->tag, *std::move(tensor));
    }
    peer->arrived.notify_all();
    return absl::OkStatus();
  }
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
  if (peer->link != nullptr) return SendLinked(peer, tag, tensor);
  if (peer->outbox != nullptr && peer->outbox->Fits(tensor)) return SendShared(peer, tag, tensor);
  messages_over_socket_.fetch_add(1, std::memory_order_relaxed);
  std::array<std::byte, kFrameHeaderBytes> header;
  EncodeFrameHeader(TensorHeader(tag, tensor), header.data());
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

absl::Status TcpTransport::SendShared(Peer* peer, const MessageTag& tag,
                                      const backend::Tensor& tensor) {
  int slot = -1;
  {
    const auto timeout = std::min(options_.recv_timeout, absl::Hours(24 * 365));
    const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
    std::unique_lock<std::mutex> lock(peer->mu);
    if (!peer->slot_freed.wait_until(
            lock, deadline, [&] { return !peer->free_slots.empty() || !peer->read_status.ok(); })) {
      return absl::DeadlineExceededError(absl::StrCat("sending ", ToString(tag), " to ",
                                                      peer->Name(), ": no inbox slot freed within ",
                                                      absl::FormatDuration(options_.recv_timeout)));
    }
    if (!peer->read_status.ok()) return peer->read_status;
    slot = peer->free_slots.back();
    peer->free_slots.pop_back();
    peer->in_flight[static_cast<size_t>(slot)] = tensor;  // allocated until the credit
  }
  absl::Status put;
  {
    std::lock_guard<std::mutex> lock(peer->put_mu);
    put = peer->outbox->Put(slot, tensor);
  }
  if (!put.ok()) {  // nothing was sent: the slot is free again
    {
      std::lock_guard<std::mutex> lock(peer->mu);
      peer->in_flight[static_cast<size_t>(slot)] = backend::Tensor();
      peer->free_slots.push_back(slot);
    }
    return absl::Status(put.code(), absl::StrCat("sending ", ToString(tag), " to ", peer->Name(),
                                                 ": ", put.message()));
  }
  std::lock_guard<std::mutex> lock(peer->write_mu);
  ZO_RETURN_IF_ERROR(peer->WriteHeaderLocked(TensorHeader(tag, tensor, slot)));
  messages_shared_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

// The link's send and the header go out in the same order (under the write
// lock): the receiver's reader takes each header's tensor off the link.
absl::Status TcpTransport::SendLinked(Peer* peer, const MessageTag& tag,
                                      const backend::Tensor& tensor) {
  std::lock_guard<std::mutex> lock(peer->write_mu);
  if (!peer->write_status.ok()) return peer->write_status;
  if (absl::Status s = peer->link->Send(tensor); !s.ok()) {
    peer->write_status = absl::Status(
        s.code(), absl::StrCat("sending ", ToString(tag), " to ", peer->Name(), ": ", s.message()));
    return peer->write_status;
  }
  ZO_RETURN_IF_ERROR(peer->WriteHeaderLocked(TensorHeader(tag, tensor, kOnLink)));
  messages_linked_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

void TcpTransport::ReturnCredit(Peer* peer, int slot) {
  credit_writer_->Post({[peer, slot] {
    std::lock_guard<std::mutex> lock(peer->write_mu);
    (void)peer->WriteHeaderLocked(pipeline_internal::Credit(slot));  // a failure is sticky
  }});
}

std::string TcpTransport::Route(int stage) const {
  const Peer* peer = FindPeer(stage);
  if (peer == nullptr) return "none (not a ring neighbour)";
  return peer->fd < 0 ? "memory (this stage itself)" : peer->route;
}

TcpTransportStats TcpTransport::stats() const {
  return {.messages_linked = messages_linked_.load(std::memory_order_relaxed),
          .messages_shared = messages_shared_.load(std::memory_order_relaxed),
          .messages_over_socket = messages_over_socket_.load(std::memory_order_relaxed)};
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
