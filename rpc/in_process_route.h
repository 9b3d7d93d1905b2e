// The in-process route of the data plane (docs/architecture.md, "Routes"):
// what an offload server in the caller's own process offers in place of the
// PushGradients and PullParams streams. Gradients are handed over as spans,
// which the server's accumulator converts and sums straight from the
// caller's memory; weights are written from the server's version (or
// rounded from its master) straight into the caller's buffers. No protobuf
// payload, no gRPC byte buffer, no thread hop on the data path. Of the
// control calls, the one every step makes (SetStepLr) is a call here too;
// the others (OpenJob, status, checkpoints) still go over the in-process
// channel.
//
// Only code that holds the server object gets one
// (OffloadServer::DataRoute), so no token is checked: the caller is the
// server's own process.
//
// It lives below both worker/ and server/ so that the client uses what the
// server implements without either including the other.
//
// Thread-safe. Once the server has shut down every call answers UNAVAILABLE.
#ifndef ZO_RPC_IN_PROCESS_ROUTE_H_
#define ZO_RPC_IN_PROCESS_ROUTE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/zo/v1/coordination.pb.h"
#include "proto/zo/v1/gradients.pb.h"
#include "proto/zo/v1/params.pb.h"

namespace zo {

class InProcessRoute {
 public:
  virtual ~InProcessRoute() = default;

  // What a push that has to wait needs for its retry (opaque to callers).
  struct PushWait {
    int64_t resets = -1;
    uint64_t ticket = 0;  // 0: no wake kept
  };
  enum class PushOutcome { kAdded, kWaiting };

  // One gradient piece: `header` is a GradientPiece with every field but
  // `data`, whose bytes are `data`. Never blocks. A piece whose chunk is
  // still updating the step before is not added: `wake` is kept and runs
  // once, on a server thread, when the chunk is released (or the job closed,
  // reset or stopped); the caller then calls again with the same `wait`, and
  // keeps `data` valid until it does. With `lent` (may be null: the bytes
  // are read before the call returns), the server may read `data` in place
  // until its update of the step has used it, keeping `lent`, the bytes'
  // owner, until then (at the latest until the step's version is made, or
  // the job reset); the caller leaves the bytes unchanged meanwhile.
  // Errors are PushGradients's.
  virtual absl::StatusOr<PushOutcome> TryPush(const v1::GradientPiece& header,
                                              absl::Span<const std::byte> data, PushWait* wait,
                                              std::function<void()> wake,
                                              std::shared_ptr<const void> lent) = 0;
  // Takes back a kept wake; false when it has already run or is queued to.
  virtual bool CancelPushWait(const v1::GradientPiece& header, const PushWait& wait) = 0;
  // Where the server keeps the `elems` elements `header` names (a push's
  // header without data) once pushed: for the caller to write the gradient
  // there and push it from those bytes, which then copies nothing. Empty
  // where the server cannot lend them (several contributors sum into fp32,
  // the chunk still updates the step before, some of the range is pushed);
  // the caller then pushes from its own memory. Errors are PushGradients's.
  virtual absl::StatusOr<absl::Span<std::byte>> LendGradientPlace(const v1::GradientPiece& header,
                                                                  int64_t elems) = 0;

  // True when job `job` (the instance `incarnation`, 0: any) has `version`.
  // Otherwise `wake` is kept, *ticket set, and false returned; the wake runs
  // once when the version comes, or the job needs a restore or stops: ask
  // again then. Errors are PullParams's.
  virtual absl::StatusOr<bool> AwaitVersion(const std::string& job, int64_t version,
                                            uint64_t incarnation, std::function<void()> wake,
                                            uint64_t* ticket) = 0;
  // Takes back a kept wake; false when it has already run or is queued to.
  virtual bool CancelVersionWait(const std::string& job, uint64_t ticket) = 0;

  // Elements [offset, offset + elems) of tensor `tensor`, pulled.
  struct PulledRange {
    int tensor = 0;
    int64_t offset = 0;
    int64_t elems = 0;
  };
  // Where a range goes: the caller checks that it asked this server for it
  // and returns the destination of its first element, or an error (then
  // nothing is written and the pull fails with it).
  using Place = absl::FunctionRef<absl::StatusOr<std::byte*>(const PulledRange&)>;
  struct PullResult {
    bool unchanged = false;  // the weights equal have_version's; nothing written
    double loss_scale = 1;
    int64_t bytes = 0;  // written through `place`
  };
  // The elements this server owns of the request's tensors at a version the
  // job has (FAILED_PRECONDITION for one it does not have yet or no longer
  // holds; UNAVAILABLE while a restore replaces them: ask again), in the
  // job's dtype, each range read or rounded once, into where `place` says.
  virtual absl::StatusOr<PullResult> PullInto(const v1::PullParamsRequest& request,
                                              Place place) = 0;

  // A pull the update writes: called before waiting for the request's
  // version, it asks `place` where every range goes, and when that version
  // is the next one and its update has not begun, the update rounds each
  // tile's new weights straight into those places while they are in cache
  // (no second pass over the server's memory). Returns an id for
  // TakeFilledPull, or 0 when the server does not (then nothing is kept).
  // The caller keeps the places valid until TakeFilledPull or WithdrawPull
  // returns.
  virtual absl::StatusOr<uint64_t> RegisterPull(const v1::PullParamsRequest& request,
                                                Place place) = 0;
  // Once AwaitVersion said the version is there: the pull's answer when
  // its update filled the registration `id` (waiting while it still writes),
  // nullopt when it did not (a skipped step, a failed update, a restore):
  // then PullInto. Ends the registration either way.
  virtual absl::StatusOr<std::optional<PullResult>> TakeFilledPull(
      const v1::PullParamsRequest& request, uint64_t id) = 0;
  // Ends a registration that will not be taken (the wait failed or was
  // cancelled): once this returns, nothing is written into its places.
  virtual void WithdrawPull(uint64_t id) = 0;

  // A step's learning rates (and group settings) for the job, as the
  // SetStepLr call gives them; its errors.
  virtual absl::Status SetStepLr(const v1::StepLrRequest& request) = 0;
};

}  // namespace zo

#endif  // ZO_RPC_IN_PROCESS_ROUTE_H_
