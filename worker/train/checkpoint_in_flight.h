// A checkpoint asked of the lead while training goes on: the servers take it
// at its version and write it during the next steps, so the worker does not
// wait for it either. One at a time; its outcome is printed once known. A
// checkpoint that fails (a server lost while writing its part) ends nothing:
// the job keeps its last committed one, and the next step finds out what
// happened to the servers.
#ifndef ZO_WORKER_TRAIN_CHECKPOINT_IN_FLIGHT_H_
#define ZO_WORKER_TRAIN_CHECKPOINT_IN_FLIGHT_H_

#include <cstdint>
#include <future>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/client/offload_client.h"
#include "worker/train/progress.h"

namespace zo::train {

// Used from one thread, the training loop's. Destroying it waits for the
// checkpoint in flight, whose client must live until then.
class CheckpointInFlight {
 public:
  // Waits for the one before, if any.
  void Start(OffloadClient* client, int64_t step, Progress& progress);
  void Poll(Progress& progress);
  void Wait(Progress& progress);
  // The last checkpoint's failure, OK once one succeeds: zo-train exits
  // non-zero when training ends on a failed checkpoint.
  const absl::Status& last_failure() const { return last_failure_; }

 private:
  void Report(Progress& progress);

  int64_t step_ = 0;
  absl::Status last_failure_;
  std::future<absl::StatusOr<std::string>> result_;
};

}  // namespace zo::train

#endif  // ZO_WORKER_TRAIN_CHECKPOINT_IN_FLIGHT_H_
