#include "worker/train/step_outcomes.h"

namespace zo::train {

void StepOutcomes::Observe(int64_t version, int64_t applied_steps, bool last_skipped,
                           double last_grad_norm, double last_lr) {
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
  auto now = skipped_through_.find(step);
  auto before = step == 1 ? skipped_through_.end() : skipped_through_.find(step - 1);
  int64_t before_count = 0;
  if (step > 1) {
    if (before == skipped_through_.end()) return std::nullopt;
    before_count = before->second;
  }
  if (now == skipped_through_.end()) return std::nullopt;
  StepOutcome outcome;
  outcome.skipped = now->second > before_count;
  return outcome;
}

}  // namespace zo::train
