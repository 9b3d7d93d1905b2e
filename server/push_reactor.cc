#include "server/push_reactor.h"

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
    // OnCancel may run meanwhile and reads piece_ and job_.
    std::lock_guard lock(mu_);
    wait_ = {};
    failed = ParseGradientPiece(buffer_, &slices_, &piece_);
    if (failed.ok() && (job_ == nullptr || job_->spec().name != piece_.job)) {
      absl::StatusOr<std::shared_ptr<Job>> found = registry_->Find(piece_.job);
      if (found.ok()) {
        job_ = *std::move(found);
      } else {
        failed = found.status();
      }
    }
    if (failed.ok()) failed = ResolveRegion();
  }
  if (!failed.ok()) {
    FinishWith(failed);
    return;
  }
  Attempt();
}

absl::Status PushReactor::ResolveRegion() {
  ack_slot_ = nullptr;
  if (piece_.region == 0) {
    region_.reset();
    if (piece_.region_ack_offset != 0) {
      return absl::InvalidArgumentError(
          "a gradient piece names an acknowledgement slot but no shared region");
    }
    return absl::OkStatus();
  }
  if (!piece_.data.empty()) {
    return absl::InvalidArgumentError("a gradient piece names a shared region and carries data");
  }
  if (region_ == nullptr || piece_.region != region_id_) {
    absl::StatusOr<std::shared_ptr<SharedRegion>> found = regions_->Find(piece_.region, piece_.job);
    if (!found.ok()) return found.status();
    region_ = *std::move(found);
    region_id_ = piece_.region;
  }
  absl::StatusOr<absl::Span<std::byte>> bytes =
      region_->Range(piece_.region_offset, piece_.region_bytes);
  if (!bytes.ok()) return bytes.status();
  if (piece_.region_ack_offset != 0) {
    absl::StatusOr<uint32_t*> slot = region_->AckSlot(piece_.region_ack_offset);
    if (!slot.ok()) return slot.status();
    ack_slot_ = *slot;
  }
  piece_.data = {{reinterpret_cast<const char*>(bytes->data()), bytes->size()}};
  piece_.data_bytes = bytes->size();
  return absl::OkStatus();
}

void PushReactor::Attempt() {
  std::unique_lock lock(mu_);
  absl::Status failed;
  if (cancelled_) {
    failed = absl::CancelledError("the push was cancelled while its piece waited");
  } else {
    absl::StatusOr<GradientAccumulator::PushOutcome> outcome =
        job_->TryPushGradient(piece_, &wait_, [this] { Attempt(); });
    if (!outcome.ok()) {
      failed = outcome.status();
    } else if (*outcome == GradientAccumulator::PushOutcome::kWaiting) {
      return;  // the wake calls Attempt again
    } else {
      // Summed: the worker may write the next micro-batch in its place.
      if (ack_slot_ != nullptr) SharedRegion::Acknowledge(ack_slot_, piece_.region_ack);
      ++pieces_;
      bytes_ += static_cast<int64_t>(piece_.data_bytes);
      lock.unlock();
      StartRead(&buffer_);
      return;
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
  if (wait_.ticket == WaitList::kNone || !job_->CancelPushWait(piece_, wait_)) return;
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
    response.set_pieces(pieces_);
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
