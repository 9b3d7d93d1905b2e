// A switch a worker process trips when it can no longer finish a step,
// whatever it is waiting for: a pipeline stage in another process is gone
// (its socket closed). It cancels the weight prefetches in flight, which
// would otherwise wait for a version the servers cannot reach without that
// stage, and keeps the reason for the step that then fails.
#ifndef ZO_WORKER_TRAIN_STEP_ABORT_H_
#define ZO_WORKER_TRAIN_STEP_ABORT_H_

#include <mutex>
#include <set>

#include "absl/status/status.h"
#include "worker/client/offload_client.h"

namespace zo::train {

// Thread-safe.
class StepAbort {
 public:
  // Cancels every registered prefetch, and any registered later; the first
  // reason stays.
  void Trip(absl::Status why);
  // OK until tripped.
  absl::Status reason() const;
  // A prefetch's cancellation, from its start until it was joined; cancelled
  // at once when already tripped.
  void Register(PullCancellation* cancel);
  void Unregister(PullCancellation* cancel);

 private:
  mutable std::mutex mu_;
  absl::Status why_;                    // guarded by mu_
  std::set<PullCancellation*> active_;  // guarded by mu_
};

}  // namespace zo::train

#endif  // ZO_WORKER_TRAIN_STEP_ABORT_H_
