#include "worker/train/step_abort.h"

#include <utility>

namespace zo::train {

void StepAbort::Trip(absl::Status why) {
  std::lock_guard lock(mu_);
  if (!why_.ok()) return;
  why_ = std::move(why);
  for (PullCancellation* cancel : active_) cancel->Cancel();
}

absl::Status StepAbort::reason() const {
  std::lock_guard lock(mu_);
  return why_;
}

void StepAbort::Register(PullCancellation* cancel) {
  std::lock_guard lock(mu_);
  active_.insert(cancel);
  if (!why_.ok()) cancel->Cancel();
}

void StepAbort::Unregister(PullCancellation* cancel) {
  std::lock_guard lock(mu_);
  active_.erase(cancel);
}

}  // namespace zo::train
