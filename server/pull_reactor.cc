#include "server/pull_reactor.h"

#include <utility>

#include "grpcpp/impl/codegen/proto_utils.h"
#include "rpc/payload_message.h"
#include "rpc/rpc_util.h"
#include "server/param_piece_wire.h"

namespace zo {

PullReactor::PullReactor(JobRegistry* registry, const SharedRegions* regions,
                         const absl::Status& admitted, const grpc::ByteBuffer& raw_request) {
  if (!admitted.ok()) {
    FinishWith(admitted);
    return;
  }
  grpc::ByteBuffer request = raw_request;  // shares the slices; Deserialize consumes its argument
  if (!grpc::SerializationTraits<v1::PullParamsRequest>::Deserialize(&request, &request_).ok()) {
    FinishWith(absl::InvalidArgumentError("a PullParams request that does not parse"));
    return;
  }
  absl::StatusOr<std::shared_ptr<Job>> found = registry->Find(request_.job());
  if (!found.ok()) {
    FinishWith(found.status());
    return;
  }
  job_ = *std::move(found);
  if (absl::Status s = job_->CheckPullRequest(request_); !s.ok()) {
    FinishWith(s);
    return;
  }
  if (request_.region() != 0) {
    absl::StatusOr<std::shared_ptr<SharedRegion>> region =
        regions->Find(request_.region(), request_.job());
    absl::StatusOr<absl::Span<std::byte>> area =
        region.ok()
            ? (*region)->Range(request_.region_offset(),
                               (*region)->bytes() - std::max<int64_t>(0, request_.region_offset()))
            : absl::StatusOr<absl::Span<std::byte>>(region.status());
    if (!area.ok()) {
      FinishWith(area.status());
      return;
    }
    region_ = *std::move(region);
    area_ = *area;
    // When the version is the next one, its update writes the weights into
    // the region as it goes; the pull then only says where they are.
    if (absl::StatusOr<PullFills::Id> fill = job_->RegisterPullInto(request_, area_); fill.ok()) {
      fill_ = *fill;
    }
  }
  Await();
}

void PullReactor::EndFill() {
  if (fill_ == 0) return;
  job_->WithdrawPull(fill_);
  fill_ = 0;
}

void PullReactor::Await() {
  {
    std::unique_lock lock(mu_);
    absl::Status failed;
    if (cancelled_) {
      failed = absl::CancelledError("the pull was cancelled while it waited for its version");
    } else if (absl::Status s = job_->CheckIncarnation(request_.incarnation()); !s.ok()) {
      failed = std::move(s);  // restored meanwhile: the version it waits for is undone
    } else {
      absl::StatusOr<bool> has = job_->AwaitVersion(
          request_.version(), [this] { Await(); }, &ticket_);
      if (!has.ok()) {
        failed = has.status();
      } else if (!*has) {
        return;  // the wake calls Await again
      }
    }
    if (!failed.ok()) {
      if (!ClaimFinishLocked()) return;
      lock.unlock();
      EndFill();
      Finish(ToGrpcStatus(failed));
      return;
    }
  }
  serve_start_ = absl::Now();
  // The version is the job's: an update that wrote it has ended (no wait).
  bool filled = false;
  if (fill_ != 0) {
    absl::StatusOr<std::optional<InProcessRoute::PullResult>> taken =
        job_->TakeFilledPull(request_.version(), fill_);
    fill_ = 0;
    if (!taken.ok()) {
      FinishWith(taken.status());
      return;
    }
    filled = taken->has_value();
  }
  absl::StatusOr<PullCursor> cursor = job_->OpenPull(request_);
  if (!cursor.ok()) {
    FinishWith(cursor.status());
    return;
  }
  cursor_.emplace(*std::move(cursor));
  if (filled) cursor_->SetAlreadyInArea();
  WriteNext();
}

void PullReactor::WriteNext() {
  if (region_ != nullptr) {
    PullPiece piece;
    int64_t at = 0;
    if (cursor_->NextInto(area_, &piece, &at)) {
      v1::ParamPiece header = ParamPieceHeader(piece);
      if (!piece.unchanged) {
        header.set_region_offset(request_.region_offset() + at);
        header.set_region_bytes(cursor_->bytes_given() - given_before_);
        given_before_ = cursor_->bytes_given();
        // The pieces after it in the same message, where the caller reads
        // them: one write instead of one per piece.
        while (request_.batched_ranges() && header.more_ranges_size() < kMaxPullRangesPerMessage &&
               cursor_->NextInto(area_, &piece, &at)) {
          v1::ParamRange* r = header.add_more_ranges();
          r->set_tensor(piece.tensor);
          r->set_offset(piece.offset);
          r->set_region_offset(request_.region_offset() + at);
          r->set_region_bytes(cursor_->bytes_given() - given_before_);
          given_before_ = cursor_->bytes_given();
        }
      }
      given_before_ = cursor_->bytes_given();
      piece_ = SerializeWithPayload(header, v1::ParamPiece::kDataFieldNumber, {});
      StartWrite(&piece_);
      return;
    }
  } else if (PullPiece piece; cursor_->Next(&piece)) {
    // The piece's data goes before the job.
    piece_ = EncodeParamPiece(
        piece, std::make_shared<std::pair<std::shared_ptr<Job>, std::shared_ptr<const void>>>(
                   job_, std::move(piece.owner)));
    StartWrite(&piece_);
    return;
  }
  if (!cursor_->status().ok()) {
    FinishWith(cursor_->status());
    return;
  }
  job_->RecordPull(absl::Now() - serve_start_, cursor_->bytes_given());
  FinishWith(absl::OkStatus());
}

void PullReactor::OnWriteDone(bool ok) {
  if (!ok) {
    FinishWith(absl::CancelledError("the caller went away"));
    return;
  }
  WriteNext();
}

void PullReactor::OnCancel() {
  std::unique_lock lock(mu_);
  cancelled_ = true;
  // A write in flight ends with ok = false and finishes the call; a kept
  // wake is taken back here, or (already posted) finishes it when it runs.
  if (ticket_ == WaitList::kNone || !job_->CancelVersionWait(ticket_)) return;
  ticket_ = WaitList::kNone;
  if (!ClaimFinishLocked()) return;
  lock.unlock();
  EndFill();
  Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                      "the pull was cancelled while it waited for its version"));
}

bool PullReactor::ClaimFinishLocked() {
  if (finished_) return false;
  finished_ = true;
  return true;
}

void PullReactor::FinishWith(const absl::Status& status) {
  {
    std::lock_guard lock(mu_);
    if (!ClaimFinishLocked()) return;
  }
  EndFill();
  Finish(ToGrpcStatus(status));
}

}  // namespace zo
