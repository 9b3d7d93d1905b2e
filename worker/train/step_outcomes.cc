#include "worker/train/step_outcomes.h"

#include <iterator>

namespace zo::train {

void StepOutcomes::Observe(int64_t version, int64_t applied_steps, bool last_skipped,
                           double last_grad_norm, double last_lr) {
  latest_version_ = version;
  if (version <= 0) return;
  const int64_t skipped = version - applied_steps;
  skipped_through_[version] = skipped;
  skipped_through_[version - 1] = skipped - (last_skipped ? 1 : 0);
  StepOutcome& outcome = named_[version];
  outcome.skipped = last_skipped;
  outcome.grad_norm = last_grad_norm;
  if (!last_skipped) outcome.lr = last_lr;
}

std::optional<StepOutcome> StepOutcomes::Get(int64_t step) const {
  if (auto it = named_.find(step); it != named_.end()) return it->second;
  // The nearest counters around the step: at or after it, and before it
  // (version 0 has skipped none).
  auto after = skipped_through_.lower_bound(step);
  if (after == skipped_through_.end()) return std::nullopt;
  int64_t before_version = 0, before_count = 0;
  if (after != skipped_through_.begin()) {
    before_version = std::prev(after)->first;
    before_count = std::prev(after)->second;
  } else if (step > 1) {
    return std::nullopt;
  }
  const int64_t skipped = after->second - before_count;
  StepOutcome outcome;
  if (skipped == 0) {
    outcome.skipped = false;
  } else if (skipped == after->first - before_version) {
    outcome.skipped = true;
  } else {
    return std::nullopt;  // some of the steps between were skipped, which is not said
  }
  return outcome;
}

}  // namespace zo::train
