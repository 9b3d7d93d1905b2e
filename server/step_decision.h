// The lead server's per-step decision (docs/architecture.md, "Global decisions"): from
// the gradient statistics of every chunk, whether the step is skipped, what
// the summed gradients are multiplied by, the learning rate and the next loss
// scale. Follows DeepSpeed's ZeRO optimizer:
//
//   norm      = sqrt(sum of squares of the summed grads) / (dp * loss_scale)
//   clip      = (norm + 1e-6) / gradient_clipping      (when clipping is on)
//   combined  = loss_scale * dp * (clip > 1 ? clip : 1)
//   g_applied = g_summed / combined
//
// A step with any Inf/NaN is skipped in every precision (with fp16 the loss
// scaler also reacts); a skipped step does not advance the LR schedule or
// Adam's step count.
#ifndef ZO_SERVER_STEP_DECISION_H_
#define ZO_SERVER_STEP_DECISION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/config.h"
#include "server/loss_scaler.h"
#include "server/lr_schedule.h"

namespace zo {

struct StepDecision {
  bool skip = false;
  double grad_multiplier = 0.0;  // 1 / combined; 0 when skipped
  double lr = 0.0;               // 0 when skipped
  int64_t applied_steps = 0;     // including this step when applied
  double loss_scale_used = 1.0;  // what the step's gradients were scaled by
  double next_loss_scale = 1.0;
  double grad_norm = 0.0;  // averaged, unscaled; NaN/Inf when non-finite
  // Consecutive skipped steps, this one included, at a loss scale that
  // cannot go lower (min_loss_scale, a static scale, or none): skips that no
  // longer cure themselves. 0 when this step is applied.
  int64_t stuck_skips = 0;
  // Not OK (FAILED_PRECONDITION) once stuck_skips reaches
  // zo.max_consecutive_skips: the job fails after this (skipped) step.
  absl::Status failure;
};

// What a decided step hands the update: the numbers the optimizer's
// constants are made of (a commit's grad_multiplier, lr or per-group rates,
// and applied_steps). Equal inputs make equal constants, so equal bits: a
// speculative update guessed right when its guess equals the decision's.
struct StepInputs {
  double grad_multiplier = 0.0;
  double lr = 0.0;
  std::vector<double> group_lr;  // with zo.client_lr; empty: `lr` for every group
  // With zo.client_lr, where the workers sent them: each group's betas, eps
  // and weight decay for the step; empty: the job's (ParamGroupsOf).
  std::vector<ParamGroupConfig> group_hyper;
  int64_t applied_steps = 0;
  bool operator==(const StepInputs&) const = default;
};

// 1 / (dp * loss_scale): the multiplier of a step applied unclipped, the
// same double Decide gives it.
double UnclippedGradMultiplier(int dp_world_size, double loss_scale_used);

// The inputs a step applied unclipped gets after `applied_steps` applied
// ones: what the lead's decider and a follower's guess both compute.
StepInputs UnclippedStepInputs(const LrSchedule& schedule, int dp_world_size, int64_t applied_steps,
                               double loss_scale_used);

// A value type owned by the lead's job; not thread-safe.
class StepDecider {
 public:
  StepDecider(const Config& config, int dp_world_size);

  // `chunk_sum_squares` in chunk order (the order fixes the rounding, so the
  // decision does not depend on how chunks are spread over servers).
  // `loss_scale_used` is the scale the step's gradients carry: scale() without
  // the delayed parameter update; with it, the scale that came with the
  // (older) version the step was computed on.
  StepDecision Decide(absl::Span<const double> chunk_sum_squares, bool non_finite,
                      double loss_scale_used);

  // The inputs Decide gives the next step if it is applied unclipped (no
  // overflow, a gradient norm under gradient_clipping).
  StepInputs Unclipped(double loss_scale_used) const;

  int64_t applied_steps() const { return applied_steps_; }
  const LossScaler& scaler() const { return scaler_; }

  // Checkpoint restore (the count of stuck skips starts again from 0).
  absl::Status Restore(int64_t applied_steps, const LossScalerState& scaler);

 private:
  LossScaler scaler_;
  LrSchedule schedule_;
  double clipping_;
  int dp_world_size_;
  int64_t max_consecutive_skips_;
  int64_t applied_steps_ = 0;
  int64_t stuck_skips_ = 0;
};

}  // namespace zo

#endif  // ZO_SERVER_STEP_DECISION_H_
