#include "worker/pipeline/tcp_transport.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/backend/device_link.h"
#include "worker/backend/device_sharing.h"
#include "worker/pipeline/internal/tcp_peer.h"
#include "worker/pipeline/internal/tcp_socket.h"
#include "worker/pipeline/internal/tcp_wire.h"

namespace zo::pipeline {
namespace {

using pipeline_internal::DecodeFrameHeader;
using pipeline_internal::EncodeFrameHeader;
using pipeline_internal::FrameHeader;
using pipeline_internal::kFrameHeaderBytes;
using pipeline_internal::kMaxRank;
using pipeline_internal::kOnLink;
using pipeline_internal::Prefix;
using pipeline_internal::ReadAll;
using pipeline_internal::WriteAll;

// The header announcing `tensor`: over the socket (slot -1, its payload
// follows), in an inbox slot, or on the device link (kOnLink).
FrameHeader TensorHeader(const MessageTag& tag, const backend::Tensor& tensor, int slot = -1) {
  return FrameHeader{.tag = tag,
                     .dtype = tensor.dtype(),
                     .shape = tensor.shape(),
                     .payload_bytes = static_cast<uint64_t>(tensor.nbytes()),
                     .slot = slot};
}

}  // namespace

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
