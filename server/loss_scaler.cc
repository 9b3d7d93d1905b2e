#include "server/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"

namespace zo {

LossScaler LossScaler::FromConfig(const Config& config) {
  LossScalerOptions options;
  const Fp16Config& fp16 = config.fp16;
  if (fp16.enabled) {
    options.mode = fp16.loss_scale > 0 ? LossScaleMode::kStatic : LossScaleMode::kDynamic;
    options.initial_scale =
        fp16.loss_scale > 0 ? fp16.loss_scale : std::ldexp(1.0, fp16.initial_scale_power);
    options.window = fp16.loss_scale_window;
    options.hysteresis = fp16.hysteresis;
    options.consecutive_hysteresis = fp16.consecutive_hysteresis;
    options.min_scale = fp16.min_loss_scale;
  }
  // bf16 and fp32 keep kNone: DeepSpeed creates a static scaler of 1 for them.
  return LossScaler(options);
}

LossScaler::LossScaler(const LossScalerOptions& options) : options_(options) {
  state_.scale = options_.mode == LossScaleMode::kNone ? 1.0 : options_.initial_scale;
  state_.hysteresis_left = options_.hysteresis;
}

bool LossScaler::Update(bool overflow) {
  switch (options_.mode) {
    case LossScaleMode::kNone:
      ++state_.iteration;
      return false;
    case LossScaleMode::kStatic:
      // DeepSpeed's static LossScaler never moves, but ZeRO still checks the
      // gradients of an fp16 job and skips the step on inf/nan.
      ++state_.iteration;
      return overflow;
    case LossScaleMode::kDynamic:
      UpdateDynamic(overflow);
      return overflow;
  }
  return overflow;
}

// DeepSpeed's DynamicLossScaler.update_scale, in its long-standing form (the
// one ZeRO stages 1-3 used through 2024):
//  - overflow: halve (floored at min_scale) only once the hysteresis budget is
//    spent (hysteresis == 1 or hysteresis_left == 1), else spend one unit; either
//    way the overflow restarts the window.
//  - no overflow: consecutive_hysteresis refills the budget on every good step;
//    the scale doubles when (iteration - last_overflow_iteration) % window == 0,
//    tested BEFORE the iteration counter advances. With last_overflow_iteration
//    starting at -1 this doubles on the window-th consecutive good step since the
//    last overflow (iterations 0..window-1 for a clean start), so the window-th
//    step's successor is the first to run at the doubled scale. Without
//    consecutive_hysteresis the budget refills only at that doubling.
// Newer DeepSpeed (the unified `stable_interval` rule of FP16_Optimizer) waits
// one step longer, doubling on the (window+1)-th good step. DeepSpeed also
// aborts the run on an overflow at min_scale; zo floors and keeps skipping, and
// the caller sees skip == true with scale() == min_scale.
void LossScaler::UpdateDynamic(bool overflow) {
  LossScalerState& s = state_;
  if (overflow) {
    if (options_.hysteresis == 1 || s.hysteresis_left == 1) {
      s.scale = std::max(s.scale / 2, options_.min_scale);
    } else {
      --s.hysteresis_left;
    }
    s.last_overflow_iteration = s.iteration;
  } else {
    if (options_.consecutive_hysteresis) s.hysteresis_left = options_.hysteresis;
    if ((s.iteration - s.last_overflow_iteration) % options_.window == 0) {
      if (!options_.consecutive_hysteresis) s.hysteresis_left = options_.hysteresis;
      s.scale *= 2;
    }
  }
  ++s.iteration;
}

absl::Status LossScaler::Restore(const LossScalerState& state) {
  auto invalid = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("loss scaler state: ", what));
  };
  if (!std::isfinite(state.scale) || state.scale <= 0) {
    return invalid(absl::StrCat("scale = ", state.scale, ": must be finite and > 0"));
  }
  if (options_.mode != LossScaleMode::kDynamic && state.scale != scale()) {
    return invalid(
        absl::StrCat("scale = ", state.scale, ": the configured scale is fixed at ", scale()));
  }
  if (state.iteration < 0) {
    return invalid(absl::StrCat("iteration = ", state.iteration, ": must be >= 0"));
  }
  const int64_t last = state.last_overflow_iteration;
  if (last != -1 && (last < 0 || last >= state.iteration)) {
    return invalid(absl::StrCat("last_overflow_iteration = ", last,
                                ": must be -1 or in [0, iteration = ", state.iteration, ")"));
  }
  if (state.hysteresis_left < 1 || state.hysteresis_left > options_.hysteresis) {
    return invalid(absl::StrCat("hysteresis_left = ", state.hysteresis_left, ": must be in [1, ",
                                options_.hysteresis, "]"));
  }
  state_ = state;
  return absl::OkStatus();
}

}  // namespace zo
