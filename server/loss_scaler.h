// Loss scaling for fp16 training, with the semantics of DeepSpeed's
// `DynamicLossScaler` / static `LossScaler` (docs/architecture.md, "Numerics"). The lead
// server owns one per job and feeds it each step's global overflow decision:
//
//   const bool skip = scaler.Update(overflow);   // once per step, in step order
//   // skip: leave weights, moments and the LR schedule untouched
//   // else: the step multiplies gradients by 1 / scale_used (before Update)
//
// Read `scale()` BEFORE calling Update for the step's gradients: Update moves
// the scale that the NEXT step's workers multiply their loss by.
//
// A value type, not thread-safe; the owner serialises access.
#ifndef ZO_SERVER_LOSS_SCALER_H_
#define ZO_SERVER_LOSS_SCALER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/config.h"

namespace zo {

enum class LossScaleMode {
  kNone,     // bf16 / fp32: scale 1, never skips a step
  kStatic,   // fp16.loss_scale > 0: fixed scale, an overflow still skips
  kDynamic,  // fp16.loss_scale == 0: DeepSpeed's DynamicLossScaler
};

// Fixed for the life of a job.
struct LossScalerOptions {
  LossScaleMode mode = LossScaleMode::kNone;
  double initial_scale = 1.0;  // kStatic: the scale; kDynamic: 2^initial_scale_power
  int64_t window = 1000;       // fp16.loss_scale_window; >= 1
  int hysteresis = 2;          // fp16.hysteresis (DeepSpeed's delayed_shift); >= 1
  bool consecutive_hysteresis = false;
  double min_scale = 1.0;  // fp16.min_loss_scale; > 0
  friend bool operator==(const LossScalerOptions&, const LossScalerOptions&) = default;
};

// Everything that changes from step to step: what a checkpoint stores. Field
// names follow DeepSpeed's (cur_scale, cur_iter, last_overflow_iter,
// cur_hysteresis).
struct LossScalerState {
  double scale = 1.0;
  int64_t iteration = 0;                 // Update calls so far, skipped steps included
  int64_t last_overflow_iteration = -1;  // -1: none yet
  int hysteresis_left = 1;               // overflows left before the scale halves
  friend bool operator==(const LossScalerState&, const LossScalerState&) = default;
};

class LossScaler {
 public:
  // fp16 enabled: static when fp16.loss_scale > 0, else dynamic from
  // 2^fp16.initial_scale_power. Otherwise (bf16 or fp32) kNone. Expects a
  // config validated by ParseConfig.
  static LossScaler FromConfig(const Config& config);

  explicit LossScaler(const LossScalerOptions& options);

  // The scale the current step's loss was multiplied by.
  double scale() const { return state_.scale; }

  // Records the step's global overflow flag and advances one iteration.
  // Returns true when the step must be skipped: an overflow in kStatic or
  // kDynamic mode. kNone ignores `overflow` and never skips.
  bool Update(bool overflow);

  const LossScalerOptions& options() const { return options_; }
  const LossScalerState& state() const { return state_; }

  // Replaces the state (checkpoint restore). INVALID_ARGUMENT naming the field
  // when the state could not have come from these options: a non-positive or
  // non-finite scale, a scale other than the fixed one in kNone / kStatic,
  // iteration < 0, last_overflow_iteration outside [-1, iteration), or
  // hysteresis_left outside [1, hysteresis].
  absl::Status Restore(const LossScalerState& state);

 private:
  void UpdateDynamic(bool overflow);

  // Not const, so that the type stays assignable; never changes after construction.
  LossScalerOptions options_;
  LossScalerState state_;
};

}  // namespace zo

#endif  // ZO_SERVER_LOSS_SCALER_H_
