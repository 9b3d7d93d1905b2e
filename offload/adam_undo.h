// The weights an Adam/AdamW step started from, recomputed from the state it
// left (docs/architecture.md, "Memory tiers"): what lets a server with a
// delayed parameter update serve the version before the latest without
// keeping a copy of it. Undoing AdamUpdate (optimizer_kernels.h) with the
// step's constants:
//
//   p_before ~ (p + step_size * (m / (sqrt(v) * inv_sqrt_bias2 + eps))) / decay_factor
//
// m and v are the moments after the step, as the step itself used them, so
// only the step's own rounding of p is lost: the result, rounded to fp16 or
// bf16, is the rounding of the true old weight except for rare elements that
// lay within an fp32 ulp or so of a 16-bit rounding boundary (about 1e-5 of
// them with usual recipes, up to ~1e-3 with tiny weights and a large lr).
// The caller that still knows the old weight (the update, per tile) records
// those few; see server/param_versions.h.
//
// Deterministic: the same inputs give the same bits on every call, path and
// machine (IEEE add, mul, div and sqrt only, no contraction, then
// common/convert.h's exact rounding), so the corrections found during the
// update hold for every later recomputation.
#ifndef ZO_OFFLOAD_ADAM_UNDO_H_
#define ZO_OFFLOAD_ADAM_UNDO_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "offload/optimizer_kernels.h"

namespace zo {

// For i in [0, n): out[i] = round(p_before[i]) to out.dtype (kFloat16 or
// kBFloat16; kFloat32 writes the fp32 value). Arrays hold n elements and do
// not overlap; n may be 0. Thread-safe on disjoint outputs; allocates nothing.
void RoundWeightsBeforeAdamStep(const AdamStepConstants& c, const float* p, const float* m,
                                const float* v, TypedPtr out, size_t n);

// Where that undo is wrong, for a step AdamUpdate just took (any path):
// `old_p` holds the n weights before the step (fp32), p, m and v the state
// after it. Appends, in ascending order, the index of every element whose
// RoundWeightsBeforeAdamStep(c, ...) to `dtype` differs from the rounding
// of old_p, to *index, and that rounding (DTypeSize(dtype) bytes) to
// *values. Cheap: the undo runs only for elements whose old weight lies
// closer to a rounding boundary of `dtype` than the undo can err (a bound
// of a few fp32 ulps of |old_p| + |p|, derived in adam_undo.cc; also
// fp16's subnormal and overflow ranges, non-finite values, and every
// element when the decay factor is under 0.5 or dtype is kFloat32). The
// result is exactly what comparing the undo everywhere would give.
void FindUndoMismatches(const AdamStepConstants& c, const float* old_p, const float* p,
                        const float* m, const float* v, DType dtype, size_t n,
                        std::vector<uint32_t>* index, std::vector<uint8_t>* values);

}  // namespace zo

#endif  // ZO_OFFLOAD_ADAM_UNDO_H_
