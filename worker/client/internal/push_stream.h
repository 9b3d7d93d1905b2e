// One PushGradients call: the pieces of one step for one server, written in
// the order they were queued by a thread of the stream's own.
//
// A thread per (server, step) rather than per server: with the delayed
// update a server may not read step s+1's stream until step s is done, and a
// Write blocked on that stream must not hold back step s's pieces queued for
// the same server behind it.
#ifndef ZO_WORKER_CLIENT_INTERNAL_PUSH_STREAM_H_
#define ZO_WORKER_CLIENT_INTERNAL_PUSH_STREAM_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "worker/client/internal/byte_budget.h"
#include "worker/client/internal/piece_encoding.h"
#include "worker/client/internal/push_call.h"

namespace zo::client_internal {

// Thread-safe. Bytes of a queued piece are released to `budget` once gRPC
// has taken the piece (Write returned) or the piece is dropped.
class PushStream final : public PushCall {
 public:
  // Starts the call. `budget` and `ends` (notified when the call ends; may be
  // null) must outlive the stream; `context` carries the call's deadline and
  // token. `batch_region_pieces`: the server takes GradientPiece.more_ranges
  // (AttachRegionResponse.batched_ranges), so region pieces queued together
  // go in one message (up to kMaxRegionPiecesPerMessage).
  PushStream(std::shared_ptr<grpc::Channel> channel, std::string server, int64_t step,
             std::unique_ptr<grpc::ClientContext> context, ByteBudget* budget,
             StreamEnds* ends = nullptr, bool batch_region_pieces = false);

  // Under the server's bound on more_ranges (4096, gradients.proto).
  static constexpr size_t kMaxRegionPiecesPerMessage = 1024;
  // Cancels the call if it is still open and joins its thread.
  ~PushStream() override;

  PushStream(const PushStream&) = delete;
  PushStream& operator=(const PushStream&) = delete;

  // Queues a piece whose payload bytes were acquired from the budget for this
  // step. Once the call has failed the piece is dropped (its bytes released)
  // and the call's error returned; after Close, FAILED_PRECONDITION.
  absl::Status Enqueue(EncodedPiece piece);
  // No more pieces: once the queue is written, half-close and wait for the
  // server's answer.
  void Close() override;
  // Cancels the call; queued pieces are dropped.
  void Cancel() override;
  // Waits until the call has ended, at most `timeout` (zero: just looks);
  // true when it has.
  bool WaitFor(absl::Duration timeout) override;

  // OK while the call is healthy; after a failure the call's status, with
  // the server's name. After WaitFor returned true: the call's final status.
  absl::Status status() const override;

 private:
  void Run();
  // Waits for the next message to write: the queue's first piece and, where
  // batching, the region pieces queued right behind it. Empty once closing
  // with nothing left.
  std::vector<EncodedPiece> NextMessage();
  // Drops every queued piece, releasing its bytes. Requires mu_.
  void DropQueueLocked();

  const std::shared_ptr<grpc::Channel> channel_;
  const std::string server_;
  const int64_t step_;
  const std::unique_ptr<grpc::ClientContext> context_;
  ByteBudget* const budget_;
  StreamEnds* const ends_;
  const bool batch_region_pieces_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // the thread waits: a piece queued, or closing
  std::condition_variable done_cv_;  // WaitFor waits: the call ended
  std::deque<EncodedPiece> queue_;   // guarded by mu_
  bool closing_ = false;             // guarded by mu_
  bool done_ = false;                // guarded by mu_
  absl::Status status_;              // guarded by mu_

  std::thread thread_;  // last: starts after every member above exists
};

}  // namespace zo::client_internal

#endif  // ZO_WORKER_CLIENT_INTERNAL_PUSH_STREAM_H_
