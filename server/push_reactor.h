// One PushGradients call as a gRPC callback reactor: reads a message, pushes
// its piece (and, on the same-host route, the pieces of its more_ranges, in
// order) into its job, reads the next. A piece whose chunk still updates the
// step before waits as a wake kept by the job (GradientAccumulator::TryPush),
// not as a parked thread; the next message is read only once every piece of
// this one is in, so a stream holds at most one message on the server and
// the client's flow control does the rest.
//
//   ctor -> StartRead -> OnReadDone: parse, resolve every piece, TryPush each
//                          -> all added: StartRead
//                          -> one waiting: (wake) TryPush it again, then the rest
//        -> client done writing: Finish(OK, {pieces, bytes})
//
// The reactor deletes itself in OnDone. It finishes exactly once, on the
// first of: the stream's end, a piece that fails, the call's cancellation
// (its deadline, the client gone) while no wake of it is posted.
#ifndef ZO_SERVER_PUSH_REACTOR_H_
#define ZO_SERVER_PUSH_REACTOR_H_

#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "server/gradient_accumulator.h"
#include "server/gradient_piece_view.h"
#include "server/job.h"
#include "server/job_registry.h"
#include "server/shared_regions.h"

namespace zo {

class PushReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  // Starts the call; the response is serialized into `response` at the end.
  // `regions`: the same-host route's, for pieces whose bytes lie in one.
  // `admitted`: the service's verdict on the call (its token); not OK
  // finishes the call with it at once.
  PushReactor(JobRegistry* registry, const SharedRegions* regions, const absl::Status& admitted,
              grpc::ByteBuffer* response);

  void OnReadDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override { delete this; }

 private:
  // Pushes pieces_[at_] and those after it; called again by the wake when
  // one had to wait.
  void Attempt();
  // Under mu_: true for the one caller that is to call Finish (after
  // unlocking: OnDone may run, and delete this, before Finish returns).
  bool ClaimFinishLocked();
  void FinishWith(const absl::Status& status);

  // Fills pieces_ and ack_slots_ from message_: its pieces, each with its
  // data pointed at its bytes in the caller's shared region (if it names
  // one) and its acknowledgement slot there. Every range is checked before
  // any piece is pushed.
  absl::Status ResolvePieces();
  absl::Status ResolveRegion(GradientPieceView& piece, uint32_t** ack_slot);

  JobRegistry* const registry_;
  const SharedRegions* const regions_;
  std::shared_ptr<SharedRegion> region_;  // the pieces', while they are pushed
  uint64_t region_id_ = 0;
  grpc::ByteBuffer* const response_;
  int64_t pushed_ = 0;  // pieces
  int64_t bytes_ = 0;

  grpc::ByteBuffer buffer_;          // the read in flight
  std::vector<grpc::Slice> slices_;  // message_.data points into them
  GradientPieceView message_;
  std::vector<GradientPieceView> pieces_;  // of message_, in order
  std::vector<uint32_t*> ack_slots_;       // per piece: in region_, or null
  size_t at_ = 0;                          // the piece being pushed
  std::shared_ptr<Job> job_;

  std::mutex mu_;  // taken before the job's locks
  GradientAccumulator::PushWait wait_;
  bool cancelled_ = false;
  bool finished_ = false;
};

}  // namespace zo

#endif  // ZO_SERVER_PUSH_REACTOR_H_
