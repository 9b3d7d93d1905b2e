#include "server/step_decision.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace zo {
namespace {

const char* ScaleFloorName(LossScaleMode mode) {
  switch (mode) {
    case LossScaleMode::kDynamic:
      return " (fp16.min_loss_scale)";
    case LossScaleMode::kStatic:
      return " (the static fp16.loss_scale)";
    case LossScaleMode::kNone:
      return " (no loss scaling without fp16)";
  }
  return "";
}

}  // namespace

double UnclippedGradMultiplier(int dp_world_size, double loss_scale_used) {
  return 1.0 / (static_cast<double>(dp_world_size) * loss_scale_used);
}

StepDecider::StepDecider(const Config& config, int dp_world_size)
    : scaler_(LossScaler::FromConfig(config)),
      schedule_(LrSchedule::FromConfig(config)),
      clipping_(config.gradient_clipping),
      dp_world_size_(dp_world_size),
      max_consecutive_skips_(config.zo.max_consecutive_skips) {}

StepDecision StepDecider::Decide(absl::Span<const double> chunk_sum_squares, bool non_finite,
                                 double loss_scale_used) {
  StepDecision d;
  d.loss_scale_used = loss_scale_used;
  double total = 0.0;
  for (double s : chunk_sum_squares) total += s;
  const double denom = static_cast<double>(dp_world_size_) * d.loss_scale_used;
  d.grad_norm = std::sqrt(total) / denom;
  const bool overflow = non_finite || !std::isfinite(total);
  // Read before Update: the floor is where the scale was when it overflowed.
  const bool at_floor = scaler_.options().mode != LossScaleMode::kDynamic ||
                        scaler_.scale() <= scaler_.options().min_scale;
  const bool scaler_skip = scaler_.Update(overflow);
  d.next_loss_scale = scaler_.scale();
  if (overflow || scaler_skip) {
    d.skip = true;
    d.applied_steps = applied_steps_;
    stuck_skips_ = at_floor ? stuck_skips_ + 1 : 0;
    d.stuck_skips = stuck_skips_;
    if (max_consecutive_skips_ > 0 && stuck_skips_ >= max_consecutive_skips_) {
      d.failure = absl::FailedPreconditionError(absl::StrCat(
          stuck_skips_, " consecutive steps were skipped for non-finite gradients at loss scale ",
          scaler_.scale(), ScaleFloorName(scaler_.options().mode),
          ", which cannot go lower: the gradients overflow whatever the scale. Lower the learning "
          "rate or fix the model's numerics, then restore a checkpoint (zo.max_consecutive_skips "
          "= ",
          max_consecutive_skips_, "; 0 never fails)"));
    }
    return d;
  }
  stuck_skips_ = 0;
  d.grad_multiplier = UnclippedGradMultiplier(dp_world_size_, d.loss_scale_used);
  if (clipping_ > 0.0) {
    const double clip = (d.grad_norm + 1e-6) / clipping_;
    if (clip > 1.0) d.grad_multiplier = 1.0 / (denom * clip);
  }
  d.lr = schedule_.LrAt(applied_steps_);
  d.applied_steps = ++applied_steps_;
  return d;
}

StepInputs UnclippedStepInputs(const LrSchedule& schedule, int dp_world_size, int64_t applied_steps,
                               double loss_scale_used) {
  return {.grad_multiplier = UnclippedGradMultiplier(dp_world_size, loss_scale_used),
          .lr = schedule.LrAt(applied_steps),
          .group_lr = {},
          .group_hyper = {},
          .applied_steps = applied_steps + 1};
}

StepInputs StepDecider::Unclipped(double loss_scale_used) const {
  return UnclippedStepInputs(schedule_, dp_world_size_, applied_steps_, loss_scale_used);
}

absl::Status StepDecider::Restore(int64_t applied_steps, const LossScalerState& scaler) {
  if (applied_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("applied_steps = ", applied_steps, " < 0"));
  }
  if (absl::Status s = scaler_.Restore(scaler); !s.ok()) return s;
  applied_steps_ = applied_steps;
  stuck_skips_ = 0;
  return absl::OkStatus();
}

}  // namespace zo
