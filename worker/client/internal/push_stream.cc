#include "worker/client/internal/push_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "proto/zo/v1/gradients.pb.h"
#include "rpc/rpc_util.h"
#include "worker/client/internal/call.h"

namespace zo::client_internal {

PushStream::PushStream(std::shared_ptr<grpc::Channel> channel, std::string server, int64_t step,
                       std::unique_ptr<grpc::ClientContext> context, ByteBudget* budget)
    : server_(std::move(server)),
      step_(step),
      context_(std::move(context)),
      budget_(budget),
      stub_(std::move(channel)) {
  stub_.PrepareBidiStreamingCall(context_.get(), "/zo.v1.Offload/PushGradients",
                                 grpc::StubOptions(), this);
  StartRead(&response_);
  StartCall();
}

PushStream::~PushStream() {
  bool done;
  {
    std::lock_guard lock(mu_);
    done = done_;
  }
  if (!done) Cancel();
  WaitFor(absl::InfiniteDuration());
}

absl::Status PushStream::Enqueue(EncodedPiece piece) {
  Next next = Next::kNothing;
  const grpc::ByteBuffer* buffer = nullptr;
  {
    std::lock_guard lock(mu_);
    if (status_.ok() && !closing_) {
      if (write_failed_) {
        // The call is ending; its end says why. The piece goes nowhere.
        budget_->Release(step_, piece.payload_bytes);
        return absl::OkStatus();
      }
      resend_ = resend_ || piece.resend;
      queue_.push_back(std::move(piece));
      next = NextLocked(&buffer);
    } else {
      budget_->Release(step_, piece.payload_bytes);
      if (!status_.ok()) return status_;
      return absl::FailedPreconditionError(
          absl::StrCat("step ", step_, " is being finished; push its gradients before FinishStep"));
    }
  }
  Start(next, buffer);
  return absl::OkStatus();
}

void PushStream::Close() {
  Next next;
  const grpc::ByteBuffer* buffer = nullptr;
  {
    std::lock_guard lock(mu_);
    closing_ = true;
    next = NextLocked(&buffer);
  }
  Start(next, buffer);
}

void PushStream::Cancel() {
  context_->TryCancel();
  std::lock_guard lock(mu_);
  closing_ = true;
  // The piece being written stays until its OnWriteDone releases it.
  if (writing_) {
    EncodedPiece in_flight = std::move(queue_.front());
    queue_.pop_front();
    DropQueueLocked();
    queue_.push_back(std::move(in_flight));
  } else {
    DropQueueLocked();
  }
}

PushStream::Next PushStream::NextLocked(const grpc::ByteBuffer** buffer) {
  if (writing_ || write_failed_) return Next::kNothing;
  if (!queue_.empty()) {
    writing_ = true;
    // Stays valid: a deque's push_back keeps references to its elements,
    // and only OnWriteDone pops this one.
    *buffer = &queue_.front().buffer;
    return Next::kWrite;
  }
  if (closing_ && !half_closed_) {
    half_closed_ = true;
    return Next::kWritesDone;
  }
  return Next::kNothing;
}

void PushStream::Start(Next next, const grpc::ByteBuffer* buffer) {
  if (next == Next::kWrite) StartWrite(buffer);
  if (next == Next::kWritesDone) StartWritesDone();
}

void PushStream::OnWriteDone(bool ok) {
  Next next = Next::kNothing;
  const grpc::ByteBuffer* buffer = nullptr;
  {
    std::lock_guard lock(mu_);
    writing_ = false;
    budget_->Release(step_, queue_.front().payload_bytes);
    queue_.pop_front();
    if (!ok) {
      // The call is over (OnDone says how); what is queued will not go.
      write_failed_ = true;
      DropQueueLocked();
      return;
    }
    ++written_;
    next = NextLocked(&buffer);
  }
  Start(next, buffer);
}

void PushStream::OnReadDone(bool ok) { got_response_ = ok; }

void PushStream::OnDone(const grpc::Status& grpc_status) {
  absl::Status status = FromGrpcStatus(grpc_status);
  std::unique_lock lock(mu_);
  v1::PushGradientsResponse response;
  if (status.ok() && got_response_) {
    const grpc::Status parsed =
        grpc::SerializationTraits<v1::PushGradientsResponse>::Deserialize(&response_, &response);
    if (!parsed.ok()) status = absl::DataLossError("the server's answer does not parse");
  }
  if (status.ok() && (write_failed_ || !half_closed_)) {
    status = absl::AbortedError(absl::StrCat("the call for step ", step_,
                                             " ended before every gradient piece was written"));
  } else if (status.ok() && !resend_ && response.pieces() != written_) {
    // A re-sent step may have pieces the server already had; it counts
    // those differently, so the check is for fresh steps only.
    status = absl::DataLossError(absl::StrCat("acknowledged ", response.pieces(), " of the ",
                                              written_, " gradient pieces sent for step ", step_));
  }
  status_ = ServerError(server_, status);
  DropQueueLocked();  // pieces queued after a failed write
  done_ = true;
  // Under the lock: the destructor, woken, waits for it before freeing us.
  done_cv_.notify_all();
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
  for (const auto& piece : queue_) budget_->Release(step_, piece.payload_bytes);
  queue_.clear();
}

}  // namespace zo::client_internal
