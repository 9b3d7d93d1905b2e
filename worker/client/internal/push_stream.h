// One PushGradients call: the pieces of one step for one server, written in
// the order they were queued, as a gRPC callback reactor: a write is started
// when the last one is done, and no thread waits on the stream.
//
// A call per (server, step) rather than per server: with the delayed update
// a server may not read step s+1's stream until step s is done, and a write
// held back on that stream must not hold back step s's pieces queued for the
// same server behind it.
//
// The method is called through gRPC's generic stub with the pieces already
// serialised (piece_encoding.h); a client-streaming method takes a bidi
// generic call, whose one response is read as it comes.
#ifndef ZO_WORKER_CLIENT_INTERNAL_PUSH_STREAM_H_
#define ZO_WORKER_CLIENT_INTERNAL_PUSH_STREAM_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/client_callback.h"
#include "worker/client/internal/byte_budget.h"
#include "worker/client/internal/piece_encoding.h"

namespace zo::client_internal {

// Thread-safe. Bytes of a queued piece are released to `budget` once gRPC
// has written the piece or the piece is dropped.
class PushStream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Starts the call. `budget` must outlive the stream; `context` carries the
  // call's deadline and token.
  PushStream(std::shared_ptr<grpc::Channel> channel, std::string server, int64_t step,
             std::unique_ptr<grpc::ClientContext> context, ByteBudget* budget);
  // Cancels the call if it is still open and waits for its end.
  ~PushStream() override;

  PushStream(const PushStream&) = delete;
  PushStream& operator=(const PushStream&) = delete;

  // Queues a piece whose payload bytes were acquired from the budget for this
  // step. Once the call has failed the piece is dropped (its bytes released)
  // and the call's error returned; after Close, FAILED_PRECONDITION.
  absl::Status Enqueue(EncodedPiece piece);
  // No more pieces: once the queue is written, half-close and wait for the
  // server's answer.
  void Close();
  // Cancels the call; queued pieces are dropped.
  void Cancel();
  // Waits until the call has ended, at most `timeout`; true when it has.
  bool WaitFor(absl::Duration timeout);

  // OK while the call is healthy; after a failure the call's status, with
  // the server's name. After WaitFor returned true: the call's final status.
  absl::Status status() const;

  // Reactions (gRPC's threads).
  void OnWriteDone(bool ok) override;
  void OnWritesDoneDone(bool /*ok*/) override {}
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  // What to start next: a write, the half-close once closing and drained,
  // or nothing. Decided under mu_, started after unlocking it: gRPC may run
  // a reaction inline in the starting call.
  enum class Next { kNothing, kWrite, kWritesDone };
  Next NextLocked(const grpc::ByteBuffer** buffer);
  void Start(Next next, const grpc::ByteBuffer* buffer);
  // Drops every queued piece, releasing its bytes. Requires mu_.
  void DropQueueLocked();

  const std::string server_;
  const int64_t step_;
  const std::unique_ptr<grpc::ClientContext> context_;
  ByteBudget* const budget_;
  grpc::GenericStub stub_;
  grpc::ByteBuffer response_;  // the server's one answer
  bool got_response_ = false;  // written by OnReadDone, read by OnDone

  mutable std::mutex mu_;
  std::condition_variable done_cv_;  // WaitFor waits: the call ended
  std::deque<EncodedPiece> queue_;   // guarded by mu_; front() is being written
  bool writing_ = false;             // guarded by mu_
  bool closing_ = false;             // guarded by mu_
  bool half_closed_ = false;         // guarded by mu_
  bool write_failed_ = false;        // guarded by mu_
  bool resend_ = false;              // guarded by mu_: a piece re-sent a step
  int64_t written_ = 0;              // guarded by mu_: pieces gRPC took
  bool done_ = false;                // guarded by mu_
  absl::Status status_;              // guarded by mu_
};

}  // namespace zo::client_internal

#endif  // ZO_WORKER_CLIENT_INTERNAL_PUSH_STREAM_H_
