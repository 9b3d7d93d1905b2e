#include "server/push_reactor.h"

#include "common/status_macros.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "proto/zo/v1/gradients.pb.h"
#include "rpc/rpc_util.h"

namespace zo {

PushReactor::PushReactor(JobRegistry* registry, const SharedRegions* regions,
                         const absl::Status& admitted, grpc::ByteBuffer* response)
    : registry_(registry), regions_(regions), response_(response) {
  if (!admitted.ok()) {
    FinishWith(admitted);
    return;
  }
  StartRead(&buffer_);
}

void PushReactor::OnReadDone(bool ok) {
  if (!ok) {  // the client is done writing, or the call is gone
    FinishWith(absl::OkStatus());
    return;
  }
  absl::Status failed;
  {
    // OnCancel may run meanwhile and reads pieces_ and job_.
    std::lock_guard lock(mu_);
    wait_ = {};
    pieces_.clear();
    at_ = 0;
    failed = ParseGradientPiece(buffer_, &slices_, &message_);
    if (failed.ok() && (job_ == nullptr || job_->spec().name != message_.job)) {
      absl::StatusOr<std::shared_ptr<Job>> found = registry_->Find(message_.job);
      if (found.ok()) {
        job_ = *std::move(found);
      } else {
        failed = found.status();
      }
    }
    if (failed.ok()) failed = ResolvePieces();
  }
  if (!failed.ok()) {
    FinishWith(failed);
    return;
  }
  Attempt();
}

absl::Status PushReactor::ResolvePieces() {
  if (message_.region == 0 && !message_.more_ranges.empty()) {
    return absl::InvalidArgumentError(
        "a gradient piece carries more_ranges but names no shared region");
  }
  std::vector<GradientPieceView> pieces;
  std::vector<uint32_t*> slots(message_.more_ranges.size() + 1, nullptr);
  pieces.reserve(slots.size());
  for (size_t k = 0; k < message_.more_ranges.size(); ++k) {
    pieces.push_back(message_.Range(k));
  }
  message_.more_ranges.clear();
  pieces.insert(pieces.begin(), std::move(message_));
  for (size_t k = 0; k < pieces.size(); ++k) {
    ZO_RETURN_IF_ERROR(ResolveRegion(pieces[k], &slots[k]));
  }
  pieces_ = std::move(pieces);
  ack_slots_ = std::move(slots);
  return absl::OkStatus();
}

absl::Status PushReactor::ResolveRegion(GradientPieceView& piece, uint32_t** ack_slot) {
  if (piece.region == 0) {
    region_.reset();
    if (piece.region_ack_offset != 0) {
      return absl::InvalidArgumentError(
          "a gradient piece names an acknowledgement slot but no shared region");
    }
    return absl::OkStatus();
  }
  if (!piece.data.empty()) {
    return absl::InvalidArgumentError("a gradient piece names a shared region and carries data");
  }
  if (region_ == nullptr || piece.region != region_id_) {
    absl::StatusOr<std::shared_ptr<SharedRegion>> found = regions_->Find(piece.region, piece.job);
    if (!found.ok()) return found.status();
    region_ = *std::move(found);
    region_id_ = piece.region;
  }
  absl::StatusOr<absl::Span<std::byte>> bytes =
      region_->Range(piece.region_offset, piece.region_bytes);
  if (!bytes.ok()) return bytes.status();
  if (piece.region_ack_offset != 0) {
    absl::StatusOr<uint32_t*> slot = region_->AckSlot(piece.region_ack_offset);
    if (!slot.ok()) return slot.status();
    *ack_slot = *slot;
  }
  piece.data = {{reinterpret_cast<const char*>(bytes->data()), bytes->size()}};
  piece.data_bytes = bytes->size();
  return absl::OkStatus();
}

void PushReactor::Attempt() {
  std::unique_lock lock(mu_);
  absl::Status failed;
  while (failed.ok()) {
    if (cancelled_) {
      failed = absl::CancelledError("the push was cancelled while its piece waited");
      break;
    }
    if (at_ == pieces_.size()) {
      lock.unlock();
      StartRead(&buffer_);
      return;
    }
    const GradientPieceView& piece = pieces_[at_];
    // Lent: the job may keep the region mapped and read the piece there.
    absl::StatusOr<GradientAccumulator::PushOutcome> outcome = job_->TryPushGradient(
        piece, &wait_, [this] { Attempt(); },
        piece.region != 0 && piece.region_lent ? std::shared_ptr<const void>(region_) : nullptr);
    if (!outcome.ok()) {
      failed = outcome.status();
    } else if (*outcome == GradientAccumulator::PushOutcome::kWaiting) {
      return;  // the wake calls Attempt again
    } else {
      // Summed: the worker may write the next micro-batch in its place.
      if (ack_slots_[at_] != nullptr) SharedRegion::Acknowledge(ack_slots_[at_], piece.region_ack);
      ++pushed_;
      bytes_ += static_cast<int64_t>(piece.data_bytes);
      ++at_;
      wait_ = {};  // the next piece's own
    }
  }
  if (!ClaimFinishLocked()) return;
  lock.unlock();
  Finish(ToGrpcStatus(failed));
}

void PushReactor::OnCancel() {
  std::unique_lock lock(mu_);
  cancelled_ = true;
  // A read in flight ends with ok = false and finishes the call; a kept wake
  // is taken back here, or (already posted) finishes it when it runs.
  if (wait_.ticket == WaitList::kNone || !job_->CancelPushWait(pieces_[at_], wait_)) return;
  wait_.ticket = WaitList::kNone;
  if (!ClaimFinishLocked()) return;
  lock.unlock();
  Finish(
      grpc::Status(grpc::StatusCode::CANCELLED, "the push was cancelled while its piece waited"));
}

bool PushReactor::ClaimFinishLocked() {
  if (finished_) return false;
  finished_ = true;
  return true;
}

void PushReactor::FinishWith(const absl::Status& status) {
  {
    std::lock_guard lock(mu_);
    if (!ClaimFinishLocked()) return;
  }
  if (status.ok()) {
    v1::PushGradientsResponse response;
    response.set_pieces(pushed_);
    response.set_bytes(bytes_);
    bool own_buffer = false;
    const grpc::Status s = grpc::SerializationTraits<v1::PushGradientsResponse>::Serialize(
        response, response_, &own_buffer);
    Finish(s);
    return;
  }
  Finish(ToGrpcStatus(status));
}

}  // namespace zo
