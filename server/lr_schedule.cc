#include "server/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace zo {

LrSchedule LrSchedule::FromConfig(const Config& config) {
  const double lr = config.optimizer.params.lr;
  if (!config.scheduler.has_value()) return Constant(lr);
  return FromScheduler(*config.scheduler, lr);
}

LrSchedule LrSchedule::Constant(double lr) { return LrSchedule(Kind::kConstant, {}, lr); }

LrSchedule LrSchedule::FromScheduler(const SchedulerConfig& scheduler, double optimizer_lr) {
  switch (scheduler.type) {
    case SchedulerType::kWarmupLR:
      return LrSchedule(Kind::kWarmupLR, scheduler.params, optimizer_lr);
    case SchedulerType::kWarmupDecayLR:
      return LrSchedule(Kind::kWarmupDecayLR, scheduler.params, optimizer_lr);
    case SchedulerType::kWarmupCosineLR:
      return LrSchedule(Kind::kWarmupCosineLR, scheduler.params, optimizer_lr);
  }
  return Constant(optimizer_lr);
}

LrSchedule::LrSchedule(Kind kind, const SchedulerParams& params, double base_lr)
    : kind_(kind),
      params_(params),
      base_lr_(base_lr),
      warmup_steps_(std::max<int64_t>(2, params.warmup_num_steps)),
      inverse_log_warmup_(1.0 / std::log(static_cast<double>(warmup_steps_))) {}

// DeepSpeed's _get_gamma warmup branch: "log" is log(it + 1) / log(warmup),
// reaching 1 at it = warmup - 1; "linear" is it / warmup, reaching
// (warmup - 1) / warmup there (the jump to 1 comes at it = warmup).
double LrSchedule::WarmupGamma(int64_t iteration) const {
  const auto it = static_cast<double>(iteration);
  if (params_.warmup_type == WarmupType::kLog) return inverse_log_warmup_ * std::log(it + 1);
  return it / static_cast<double>(warmup_steps_);
}

// DeepSpeed's WarmupCosineLR.get_lr_ratio after warmup, in its current form
// (clamped progress): the decay starts one step into the window, since
// progress = (it - warmup + 1) / max(1, total - warmup), so it = warmup already
// sits slightly below 1 and it = total - 1 reaches cos_min_ratio; progress is
// capped at 1 so the ratio stays at cos_min_ratio from there on (older
// DeepSpeed let it climb back up past total_num_steps). The ratio is
// cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi * progress)) / 2: the
// cosine spans [cos_min_ratio, 1], not max(cos_min_ratio, (1 + cos) / 2).
double LrSchedule::CosineRatio(int64_t iteration) const {
  const double done = static_cast<double>(iteration - warmup_steps_ + 1);
  const double span =
      static_cast<double>(std::max<int64_t>(1, params_.total_num_steps - warmup_steps_));
  const double progress = std::min(1.0, done / span);
  const double cosine = (1 + std::cos(std::numbers::pi * progress)) / 2;
  return std::max(0.0, params_.cos_min_ratio + (1 - params_.cos_min_ratio) * cosine);
}

double LrSchedule::LrAtIteration(int64_t iteration) const {
  if (kind_ == Kind::kConstant) return base_lr_;
  const double min_lr = params_.warmup_min_lr;
  const double delta_lr = params_.warmup_max_lr - min_lr;
  const bool warming_up = iteration < warmup_steps_;
  switch (kind_) {
    case Kind::kConstant:
      break;
    case Kind::kWarmupLR:
      // Before the first scheduler.step() DeepSpeed reports min_lr.
      if (iteration < 0) return min_lr;
      return min_lr + delta_lr * (warming_up ? WarmupGamma(iteration) : 1.0);
    case Kind::kWarmupDecayLR: {
      if (iteration < 0) return min_lr;
      if (warming_up) return min_lr + delta_lr * WarmupGamma(iteration);
      // Linear from max_lr at it = warmup to min_lr at it = total, then held.
      const double left = static_cast<double>(params_.total_num_steps - iteration);
      const double span =
          static_cast<double>(std::max<int64_t>(1, params_.total_num_steps - warmup_steps_));
      return min_lr + delta_lr * std::max(0.0, left / span);
    }
    case Kind::kWarmupCosineLR: {
      // Before the first scheduler.step() DeepSpeed reports a ratio of 0, not
      // warmup_min_ratio.
      if (iteration < 0) return 0.0;
      if (warming_up) {
        const double min_ratio = params_.warmup_min_ratio;
        return base_lr_ * (min_ratio + (1 - min_ratio) * WarmupGamma(iteration));
      }
      return base_lr_ * CosineRatio(iteration);
    }
  }
  return base_lr_;
}

}  // namespace zo
