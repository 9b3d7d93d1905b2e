// Following a job to where it is now: after zo-ctl rescale moved it (a
// JOB_MOVED answer), or after its servers rolled it back or went on without
// this worker. The caller attaches again, attach-only, until the job is
// there at the version the move named; meanwhile the servers may still be
// restoring it (NOT_FOUND, UNAVAILABLE, FAILED_PRECONDITION, the same move
// again, a version before the restore), and those answers are waited out
// with backoff, up to a bound. A job that needs a restore nobody is doing
// (NEEDS_RESTORE) ends the wait at once. zo-train and zo.torch both follow
// through here.
#ifndef ZO_WORKER_CLIENT_FOLLOW_JOB_H_
#define ZO_WORKER_CLIENT_FOLLOW_JOB_H_

#include <functional>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "rpc/job_move.h"
#include "worker/client/offload_client.h"

namespace zo {

struct FollowOptions {
  absl::Duration give_up = absl::Minutes(5);
  // Told what the follow waits for, first `first_note` after it began, then
  // every `note_every`. Optional.
  absl::Duration first_note = absl::Seconds(5);
  absl::Duration note_every = absl::Seconds(10);
  std::function<void(absl::Duration waited, const absl::Status& why)> note = nullptr;
  // Told every try that failed and will be tried again (zo-train restores a
  // lead that came back without the job from here). Optional.
  std::function<void(absl::Duration waited, const absl::Status& why)> retrying = nullptr;
};

// OK once the job, as `client` (attached to the move's servers) sees it, is
// restored on every server and at move.version or later; UNAVAILABLE saying
// what is missing otherwise.
absl::Status CheckArrived(OffloadClient& client, const JobMove& move);

// Calls `attach` until it returns OK. `attach` opens the caller's clients
// attach-only on move.servers and returns their failure or CheckArrived's.
// Ends early with a failure that waiting cannot cure (a move to other
// servers among them: the caller follows that one next), and with
// DEADLINE_EXCEEDED, quoting the last failure, past options.give_up.
absl::Status FollowJob(const JobMove& move, absl::FunctionRef<absl::Status()> attach,
                       const FollowOptions& options = {});

}  // namespace zo

#endif  // ZO_WORKER_CLIENT_FOLLOW_JOB_H_
