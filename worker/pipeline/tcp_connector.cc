// TcpTransport::Connect: the options' checks, the handshake with each ring
// neighbour, and the route chosen to it (a device link, inboxes in shared
// memory, or the socket).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <set>
#include <string>
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
#include "worker/pipeline/internal/tcp_peer.h"
#include "worker/pipeline/internal/tcp_socket.h"
#include "worker/pipeline/internal/tcp_wire.h"
#include "worker/pipeline/tcp_transport.h"

namespace zo::pipeline {
namespace {

using pipeline_internal::DecodeHelloFixed;
using pipeline_internal::Dial;
using pipeline_internal::EncodeHello;
using pipeline_internal::Hello;
using pipeline_internal::kHelloFixedBytes;
using pipeline_internal::kMaxHelloFieldBytes;
using pipeline_internal::kMaxInboxSlots;
using pipeline_internal::kMaxJobBytes;
using pipeline_internal::kProtocolVersion;
using pipeline_internal::Listen;
using pipeline_internal::PeerName;
using pipeline_internal::Prefix;
using pipeline_internal::ReadAll;
using pipeline_internal::ScopedFd;
using pipeline_internal::SetNoDelay;
using pipeline_internal::SocketError;
using pipeline_internal::WaitFor;
using pipeline_internal::WriteAll;

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

}  // namespace zo::pipeline
