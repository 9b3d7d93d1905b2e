// The delayed parameter update policy (docs/architecture.md, "One training step"),
// shared by workers (which version to pull) and the lead server (which loss
// scale a step's gradients carry): without DPU, or during dpu.warmup_steps,
// step s is computed on v_{s-1}; afterwards one version behind, on v_{s-2}.
// Steps count from 1; version 0 is the initial weights. A job restored at
// version `base` has no older versions, so nothing earlier is asked for.
#ifndef ZO_COMMON_DPU_POLICY_H_
#define ZO_COMMON_DPU_POLICY_H_

#include <algorithm>
#include <cstdint>

#include "common/config.h"

namespace zo {

inline int64_t VersionForStep(const DpuConfig& dpu, int64_t step, int64_t base = 0) {
  const bool delayed = dpu.enabled && step > int64_t{dpu.warmup_steps} + 1;
  return std::max(delayed ? step - 2 : step - 1, base);
}

}  // namespace zo

#endif  // ZO_COMMON_DPU_POLICY_H_
