#include "worker/train/checkpoint_in_flight.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status_context.h"

namespace zo::train {

void CheckpointInFlight::Start(OffloadClient* client, int64_t step, Progress& progress) {
  Wait(progress);
  step_ = step;
  result_ = std::async(std::launch::async, [client, step] { return client->Checkpoint(step); });
}

void CheckpointInFlight::Poll(Progress& progress) {
  if (result_.valid() && result_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    Report(progress);
  }
}

void CheckpointInFlight::Wait(Progress& progress) {
  if (result_.valid()) Report(progress);
}

void CheckpointInFlight::Report(Progress& progress) {
  const absl::StatusOr<std::string> path = result_.get();
  progress.Note(path.ok() ? absl::StrCat("zo-train: checkpoint written: ", *path)
                          : absl::StrCat("zo-train: checkpoint of step ", step_,
                                         " failed, training goes on: ", path.status().message()));
  last_failure_ =
      path.ok()
          ? absl::OkStatus()
          : WithContext(path.status(), absl::StrCat("the checkpoint of step ", step_, " failed"));
}

}  // namespace zo::train
