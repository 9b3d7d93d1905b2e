#include "worker/client/internal/push_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "rpc/byte_stream_call.h"
#include "rpc/rpc_util.h"
#include "worker/client/internal/call.h"

namespace zo::client_internal {

PushStream::PushStream(std::shared_ptr<grpc::Channel> channel, std::string server, int64_t step,
                       std::unique_ptr<grpc::ClientContext> context, ByteBudget* budget,
                       StreamEnds* ends, bool batch_region_pieces)
    : channel_(std::move(channel)),
      server_(std::move(server)),
      step_(step),
      context_(std::move(context)),
      budget_(budget),
      ends_(ends),
      batch_region_pieces_(batch_region_pieces),
      thread_([this] { Run(); }) {}

PushStream::~PushStream() {
  bool done;
  {
    std::lock_guard lock(mu_);
    done = done_;
  }
  if (!done) Cancel();
  thread_.join();
}

absl::Status PushStream::Enqueue(EncodedPiece piece) {
  {
    std::lock_guard lock(mu_);
    if (status_.ok() && !closing_) {
      queue_.push_back(std::move(piece));
      work_cv_.notify_one();
      return absl::OkStatus();
    }
  }
  budget_->Release(step_, piece.payload_bytes);
  std::lock_guard lock(mu_);
  if (!status_.ok()) return status_;
  return absl::FailedPreconditionError(
      absl::StrCat("step ", step_, " is being finished; push its gradients before FinishStep"));
}

void PushStream::Close() {
  std::lock_guard lock(mu_);
  closing_ = true;
  work_cv_.notify_one();
}

void PushStream::Cancel() {
  context_->TryCancel();
  std::lock_guard lock(mu_);
  closing_ = true;
  DropQueueLocked();
  work_cv_.notify_one();
}

bool PushStream::WaitFor(absl::Duration timeout) {
  std::unique_lock lock(mu_);
  if (timeout == absl::InfiniteDuration()) {  // wait_for(nanoseconds::max()) would overflow
    done_cv_.wait(lock, [&] { return done_; });
    return true;
  }
  return done_cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return done_; });
}

absl::Status PushStream::status() const {
  std::lock_guard lock(mu_);
  return status_;
}

void PushStream::DropQueueLocked() {
  for (const auto& piece : queue_) {
    budget_->Release(step_, piece.payload_bytes);
  }
  queue_.clear();
}

std::vector<EncodedPiece> PushStream::NextMessage() {
  std::vector<EncodedPiece> batch;
  std::unique_lock lock(mu_);
  work_cv_.wait(lock, [&] { return !queue_.empty() || closing_; });
  if (queue_.empty()) return batch;
  batch.push_back(std::move(queue_.front()));
  queue_.pop_front();
  if (!batch_region_pieces_ || !batch[0].region_header.has_value()) return batch;
  while (!queue_.empty() && batch.size() < kMaxRegionPiecesPerMessage &&
         queue_.front().region_header.has_value() &&
         SameRegionMessage(*batch.front().region_header, *queue_.front().region_header)) {
    batch.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  return batch;
}

void PushStream::Run() {
  v1::PushGradientsResponse response;
  // The generated stub's writer takes messages; this call takes the pieces
  // already serialised (piece_encoding.h) for the same method.
  auto call =
      std::make_unique<ByteStreamCall>(channel_, context_.get(), "/zo.v1.Offload/PushGradients");
  int64_t pieces = 0;
  bool resend = false;
  bool write_failed = false;
  for (;;) {
    std::vector<EncodedPiece> batch = NextMessage();
    if (batch.empty()) break;  // closing, and everything is written
    int64_t payload = 0;
    for (const EncodedPiece& p : batch) {
      resend = resend || p.resend;
      payload += p.payload_bytes;
    }
    // Write returns once gRPC has taken the message (flow control allowing);
    // only then do its bytes stop counting against max_bytes_in_flight.
    const bool ok =
        call->Write(batch.size() == 1 ? batch[0].buffer : EncodeRegionPieces(batch).buffer);
    budget_->Release(step_, payload);
    if (!ok) {
      write_failed = true;
      break;
    }
    pieces += static_cast<int64_t>(batch.size());
  }
  absl::Status status = FromGrpcStatus(call->Finish(&response));
  if (status.ok() && write_failed) {
    status = absl::AbortedError(absl::StrCat("the call for step ", step_,
                                             " ended before every gradient piece was written"));
  } else if (status.ok() && !resend && response.pieces() != pieces) {
    // A re-sent step may have pieces the server already had; it counts
    // those differently, so the check is for fresh steps only.
    status = absl::DataLossError(absl::StrCat("acknowledged ", response.pieces(), " of the ",
                                              pieces, " gradient pieces sent for step ", step_));
  }
  // The call lets go of the pieces' bytes (their owners) before anyone
  // waiting hears the step is done: a caller may then reuse them.
  call.reset();
  {
    std::lock_guard lock(mu_);
    status_ = ServerError(server_, status);
    DropQueueLocked();  // pieces queued after a failed Write
    done_ = true;
  }
  done_cv_.notify_all();
  if (ends_ != nullptr) {
    // Taken and let go so that a waiter between checking its streams and
    // waiting cannot miss this.
    { std::lock_guard lock(ends_->mu); }
    ends_->cv.notify_all();
  }
}

}  // namespace zo::client_internal
