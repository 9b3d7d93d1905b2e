// The delayed parameter update's compensation (zo.dpu.compensation
// "worker"; docs/architecture.md, "Delayed parameter update"): with DPU
// step s computes on w_{s-2} while the servers still apply step s-1. The
// worker, which holds step s-1's gradient g and the last two versions it
// pulled, computes step s on
//
//   W = A w_{s-2} + B w_{s-3} - C g
//
// instead: step s-1's AdamW update whole but for v's last update and with
// one gain per tensor. Its momentum part is step s-2's update w_{s-2} -
// w_{s-3} (1 - lr_{s-2} wd) turned into step s-1's (times a = beta1
// (lr_{s-1} / lr_{s-2}) (c1(n) / c1(n+1)) sqrt(c2(n+1) / c2(n)), n
// Adam's count after step s-2; exact but for eps); its gradient part is
// g times C = multiplier lr_{s-1} (1 - beta1) / (c1(n+1) (sqrt(mean v /
// c2(n+1)) + eps)), v's mean over the tensor after step s-2 and the
// multiplier the lead decided for step s-1 (clip / (dp x loss scale)) times
// dp: with several dp ranks each worker adds its own rank's gradient, which
// stands for the mean of theirs (its weights then differ from the other
// ranks' for that one step; the versions stay common).
// A skipped step s-1 gives A 1, B and C 0: w_{s-2} is w_{s-1}.
//
// Each server sends, per tensor it holds a part of, the terms below; the
// worker adds the parts up (CombineTerms). Both sides use this file, so the
// formula is written once.
#ifndef ZO_COMMON_DPU_COMPENSATION_H_
#define ZO_COMMON_DPU_COMPENSATION_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace zo {

// One server's part of one tensor, for the step whose gradient the worker
// adds (s-1 above).
struct CompensationTerms {
  int32_t tensor = 0;
  int64_t elems = 0;          // of the tensor on this server
  double v_sum = 0;           // Adam's v summed over them, before the step
  double keep = 1;            // 1 - lr wd: what the step's decay keeps
  double momentum = 0;        // a; 0 when the step before was skipped or unknown
  double previous_keep = 1;   // 1 - lr_{s-2} wd
  double gain = 0;            // multiplier lr (1 - beta1) / c1(n+1); 0 when skipped
  double inv_sqrt_bias2 = 1;  // 1 / sqrt(c2(n+1))
  double eps = 0;
};

// What a server knows of the step when its lead has decided it.
struct CompensatedStep {
  bool skipped = false;
  double grad_multiplier = 0;
  double lr = 0;               // the tensor's group's
  int64_t applied_before = 0;  // Adam's count before the step (n)
  // The step before's lr (the group's) when it was applied; nullopt when
  // it was skipped or is not known (the job restored since).
  std::optional<double> previous_lr = std::nullopt;
};

// Adam's hyper-parameters of the tensor's group (AdamW: decoupled decay).
struct CompensationHyperParams {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  bool bias_correction = true;
};

CompensationTerms TermsFor(const CompensationHyperParams& hp, const CompensatedStep& step,
                           int32_t tensor, int64_t elems, double v_sum);

struct WeightsCompensation {
  double last = 1;    // A, on w_{s-2}
  double before = 0;  // B, on w_{s-3}
  double grad = 0;    // C, on the raw gradient (loss-scaled, summed over micro-batches)
};

// The coefficients of one tensor from the terms of every server holding a
// part of it. `have_before`: the worker holds w_{s-3} (not after a restart
// or when step s-1 computed on w_{s-2} too). INVALID_ARGUMENT when the
// parts name different tensors or disagree on the step's constants, or
// there are none.
absl::StatusOr<WeightsCompensation> CombineTerms(absl::Span<const CompensationTerms> parts,
                                                 bool have_before);

}  // namespace zo

#endif  // ZO_COMMON_DPU_COMPENSATION_H_
