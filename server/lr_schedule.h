// Learning-rate schedules with the semantics of DeepSpeed's WarmupLR,
// WarmupDecayLR and WarmupCosineLR (deepspeed/runtime/lr_schedules.py), plus
// the constant lr of a config without a `scheduler` section (docs/architecture.md,
// "Numerics"). Pure functions of the step count: the only schedule state a
// checkpoint needs is the number of applied steps.
//
// Step indexing. A skipped step (fp16 overflow) does not advance the schedule,
// so the argument is the number of APPLIED steps. DeepSpeed's engine runs
// optimizer.step() and only then lr_scheduler.step(), and the scheduler's
// constructor has already set the lr for last_batch_iteration = -1. So the
// applied step with k applied steps before it runs at
//
//   LrAt(k) == LrAtIteration(k - 1)
//
// i.e. the first applied step uses the "not started" value (warmup_min_lr for
// WarmupLR / WarmupDecayLR, 0 for WarmupCosineLR) and the second uses
// last_batch_iteration = 0. LrAtIteration is DeepSpeed's get_lr() as a function
// of last_batch_iteration.
//
// An immutable value type; safe to share between threads.
#ifndef ZO_SERVER_LR_SCHEDULE_H_
#define ZO_SERVER_LR_SCHEDULE_H_

#include <cstdint>

#include "common/config.h"

namespace zo {

class LrSchedule {
 public:
  enum class Kind { kConstant, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };

  // `scheduler` absent: constant optimizer.params.lr. WarmupCosineLR's ratios
  // multiply optimizer.params.lr; the other two use warmup_min_lr / warmup_max_lr.
  // Expects a config validated by ParseConfig.
  static LrSchedule FromConfig(const Config& config);
  static LrSchedule Constant(double lr);
  static LrSchedule FromScheduler(const SchedulerConfig& scheduler, double optimizer_lr);

  // The lr of the applied step that has `applied_steps_before` (>= 0) applied
  // steps before it. See the header comment.
  double LrAt(int64_t applied_steps_before) const {
    return LrAtIteration(applied_steps_before - 1);
  }

  // DeepSpeed's get_lr() at last_batch_iteration = `iteration`; any negative
  // iteration is "not started".
  double LrAtIteration(int64_t iteration) const;

  Kind kind() const { return kind_; }

 private:
  LrSchedule(Kind kind, const SchedulerParams& params, double base_lr);

  // Warmup progress in [0, 1] for 0 <= iteration < warmup_steps_.
  double WarmupGamma(int64_t iteration) const;
  double CosineRatio(int64_t iteration) const;

  Kind kind_;
  SchedulerParams params_;
  double base_lr_;  // kConstant: the lr; kWarmupCosineLR: what the ratio multiplies
  // DeepSpeed clamps warmup_num_steps to at least 2 (so log(warmup) > 0) and
  // uses the clamped value everywhere, the decay denominators included.
  int64_t warmup_steps_;
  double inverse_log_warmup_;
};

}  // namespace zo

#endif  // ZO_SERVER_LR_SCHEDULE_H_
