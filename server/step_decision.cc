#include "server/step_decision.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace zo {

StepDecider::StepDecider(const Config& config, int dp_world_size)
    : scaler_(LossScaler::FromConfig(config)),
      schedule_(LrSchedule::FromConfig(config)),
      clipping_(config.gradient_clipping),
      dp_world_size_(dp_world_size) {}

StepDecision StepDecider::Decide(absl::Span<const double> chunk_sum_squares, bool non_finite,
                                 double loss_scale_used) {
  StepDecision d;
  d.loss_scale_used = loss_scale_used;
  double total = 0.0;
  for (double s : chunk_sum_squares) total += s;
  const double denom = static_cast<double>(dp_world_size_) * d.loss_scale_used;
  d.grad_norm = std::sqrt(total) / denom;
  const bool overflow = non_finite || !std::isfinite(total);
  const bool scaler_skip = scaler_.Update(overflow);
  d.next_loss_scale = scaler_.scale();
  if (overflow || scaler_skip) {
    d.skip = true;
    d.applied_steps = applied_steps_;
    return d;
  }
  double combined = denom;
  if (clipping_ > 0.0) {
    const double clip = (d.grad_norm + 1e-6) / clipping_;
    if (clip > 1.0) combined *= clip;
  }
  d.grad_multiplier = 1.0 / combined;
  d.lr = schedule_.LrAt(applied_steps_);
  d.applied_steps = ++applied_steps_;
  return d;
}

absl::Status StepDecider::Restore(int64_t applied_steps, const LossScalerState& scaler) {
  if (applied_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("applied_steps = ", applied_steps, " < 0"));
  }
  if (absl::Status s = scaler_.Restore(scaler); !s.ok()) return s;
  applied_steps_ = applied_steps;
  return absl::OkStatus();
}

}  // namespace zo
