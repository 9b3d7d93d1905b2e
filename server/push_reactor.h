// One PushGradients call as a gRPC callback reactor: reads a piece, pushes it
// into its job, reads the next. A piece whose chunk still updates the step
// before waits as a wake kept by the job (GradientAccumulator::TryPush), not
// as a parked thread; the next piece is read only once it is in, so a
// stream holds at most one piece on the server and the client's flow
// control does the rest.
//
//   ctor -> StartRead -> OnReadDone: parse, TryPush -> added: StartRead
//                                                   -> waiting: (wake) TryPush again
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
  // Pushes piece_; called again by the wake when it had to wait.
  void Attempt();
  // Under mu_: true for the one caller that is to call Finish (after
  // unlocking: OnDone may run, and delete this, before Finish returns).
  bool ClaimFinishLocked();
  void FinishWith(const absl::Status& status);

  // Points the piece's data at its bytes in the caller's shared region, and
  // ack_slot_ at its acknowledgement slot there.
  absl::Status ResolveRegion();

  JobRegistry* const registry_;
  const SharedRegions* const regions_;
  std::shared_ptr<SharedRegion> region_;  // the piece's, while it is pushed
  uint64_t region_id_ = 0;
  uint32_t* ack_slot_ = nullptr;  // in region_: where the piece is acknowledged
  grpc::ByteBuffer* const response_;
  int64_t pieces_ = 0;
  int64_t bytes_ = 0;

  grpc::ByteBuffer buffer_;          // the read in flight
  std::vector<grpc::Slice> slices_;  // piece_.data points into them
  GradientPieceView piece_;
  std::shared_ptr<Job> job_;

  std::mutex mu_;  // taken before the job's locks
  GradientAccumulator::PushWait wait_;
  bool cancelled_ = false;
  bool finished_ = false;
};

}  // namespace zo

#endif  // ZO_SERVER_PUSH_REACTOR_H_
