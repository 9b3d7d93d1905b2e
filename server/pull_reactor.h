// One PullParams call as a gRPC callback reactor: waits for the version
// asked (a wake kept by the job, not a parked thread), then writes the
// pieces of a PullCursor one at a time, each when the last is on its way.
// The method is raw (bytes in, bytes out): pieces go out as
// EncodeParamPiece makes them, their weights never copied.
//
//   ctor: check -> (into a region: RegisterPullInto) -> AwaitVersion
//     -> has it: OpenPull (taking what the update wrote), StartWrite(first)
//     -> waiting: (wake) AwaitVersion again
//   OnWriteDone -> StartWrite(next) ... -> Finish(OK)
//
// The reactor deletes itself in OnDone. It finishes exactly once, on the
// first of: the last piece written, a failure, the call's cancellation (its
// deadline, the client gone) while no wake of it is posted.
#ifndef ZO_SERVER_PULL_REACTOR_H_
#define ZO_SERVER_PULL_REACTOR_H_

#include <memory>
#include <mutex>
#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/zo/v1/params.pb.h"
#include "server/job.h"
#include "server/job_registry.h"
#include "server/pull_cursor.h"
#include "server/shared_regions.h"
#include "server/wait_list.h"

namespace zo {

class PullReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // With PullParamsRequest.batched_ranges: the most ParamPiece.more_ranges
  // one message carries (params.proto).
  static constexpr int kMaxPullRangesPerMessage = 1024;

  // `raw_request`: a serialized v1::PullParamsRequest.
  // `regions`: the same-host route's, for a pull into one.
  // `admitted`: the service's verdict on the call (its token); not OK
  // finishes the call with it at once.
  PullReactor(JobRegistry* registry, const SharedRegions* regions, const absl::Status& admitted,
              const grpc::ByteBuffer& raw_request);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override {
    EndFill();
    delete this;
  }

 private:
  // Asks the job for the version; called again by the wake while it waits.
  void Await();
  // Ends the registration of a pull the update was to write (before the
  // call finishes: the caller may pull into its region again right after).
  void EndFill();
  // Writes the cursor's next piece, or finishes after the last.
  void WriteNext();
  bool ClaimFinishLocked();
  void FinishWith(const absl::Status& status);

  v1::PullParamsRequest request_;
  std::shared_ptr<Job> job_;
  // With PullParamsRequest.region: the caller's region and its weights area.
  std::shared_ptr<SharedRegion> region_;
  absl::Span<std::byte> area_;
  int64_t given_before_ = 0;  // cursor_->bytes_given() before the piece in flight
  // The pull registered for the next version's update to write into the
  // region (Job::RegisterPullInto); 0: none.
  PullFills::Id fill_ = 0;
  std::optional<PullCursor> cursor_;
  grpc::ByteBuffer piece_;  // the write in flight
  absl::Time serve_start_;

  std::mutex mu_;  // taken before the job's locks
  WaitList::Ticket ticket_ = WaitList::kNone;
  bool cancelled_ = false;
  bool finished_ = false;
};

}  // namespace zo

#endif  // ZO_SERVER_PULL_REACTOR_H_
