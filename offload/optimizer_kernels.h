// Fused per-element optimizer kernels over one contiguous range: the inner
// loop of the server's step (docs/architecture.md, "Numerics"). One pass over memory per
// element: load the gradient (fp32, fp16 or bf16), scale it, update the fp32
// moments and master weight in place, and write the low-precision copy of the
// new weight. Every per-step scalar (bias corrections, step size, decay) is
// computed once by the *StepConstants helpers, never per element.
//
// Each kernel has a scalar reference and AVX2 / AVX-512 paths selected by
// SimdLevel (common/cpu_features.h); the overload without a level dispatches on
// ActiveSimdLevel(); an explicit level must be SimdLevelSupported() (tests,
// benchmarks). Paths agree with the scalar one to within a few fp32 ulps
// (they may contract a*b+c into an FMA); the low-precision copy is always the
// round-to-nearest-even conversion of the new fp32 master actually stored.
//
// Contracts for every kernel: the arrays hold n elements and do not overlap;
// n may be 0; no alignment is required (64-byte alignment is fastest).
// Thread-safe on disjoint ranges; nothing is allocated. Stores are ordinary
// (no non-temporal ones: measured no faster), so the caller's usual
// synchronisation publishes them; AdamUpdateBeside's non-temporal ones end
// with a fence, so the same holds for it.
#ifndef ZO_OFFLOAD_OPTIMIZER_KERNELS_H_
#define ZO_OFFLOAD_OPTIMIZER_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "common/cpu_features.h"
#include "common/dtype.h"

namespace zo {

// A gradient (or other low-precision) buffer and its element type.
struct TypedConstPtr {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
};
// An optional output: data == nullptr means "do not write". kFloat16 and
// kBFloat16 round to nearest even; kFloat32 is a plain copy.
struct TypedPtr {
  void* data = nullptr;
  DType dtype = DType::kFloat16;
};

// ---- Adam / AdamW, as torch.optim.Adam / AdamW define them ----

struct AdamHyperParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool adam_w_mode = true;      // decoupled decay p *= 1 - lr*wd (AdamW) vs g += wd*p (Adam)
  bool bias_correction = true;  // false: bias corrections are 1
};

// Per-step constants, all in fp32 as the kernels use them.
struct AdamStepConstants {
  float grad_scale;  // multiplies each raw gradient
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2;
  float step_size;       // lr / (1 - beta1^step)
  float inv_sqrt_bias2;  // 1 / sqrt(1 - beta2^step)
  float eps;
  float weight_decay;  // Adam (L2): g += weight_decay * p; 0 for AdamW
  float decay_factor;  // AdamW: p *= decay_factor (1 - lr*wd); 1 for Adam
};

// `step` counts from 1 (the first update). `grad_scale` is the step's
// clip_coef / (loss_scale * dp_world_size). Computed in double, rounded once.
AdamStepConstants MakeAdamStepConstants(const AdamHyperParams& hp, int64_t step, double grad_scale);

// For i in [0, n):
//   g = grad[i] * grad_scale;  g += weight_decay * p[i]       (Adam mode)
//   p[i] *= decay_factor                                        (AdamW mode)
//   m[i] = beta1 * m[i] + (1 - beta1) * g
//   v[i] = beta2 * v[i] + (1 - beta2) * g * g
//   p[i] -= step_size * (m[i] / (sqrt(v[i]) * inv_sqrt_bias2 + eps))
//   low_precision[i] = round_to_nearest_even(p[i])              (if given)
// With CopyOf::kOldWeight the copy rounds p[i] as it was before the update
// instead (kFloat32: the old weight itself), written while the weight is in
// a register anyway: what a delayed parameter update checks its undo of the
// step against (offload/adam_undo.h).
enum class CopyOf { kNewWeight, kOldWeight };
void AdamUpdate(const AdamStepConstants& c, TypedConstPtr grad, float* p, float* m, float* v,
                TypedPtr low_precision, size_t n, SimdLevel level,
                CopyOf copy_of = CopyOf::kNewWeight);
void AdamUpdate(const AdamStepConstants& c, TypedConstPtr grad, float* p, float* m, float* v,
                TypedPtr low_precision, size_t n, CopyOf copy_of = CopyOf::kNewWeight);

// The same step written beside the state instead of over it: reads p, m
// and v, leaves them as they were, and writes the new values to `out`'s
// arrays (n elements each, overlapping neither the inputs nor each other).
// Gives out exactly the bits AdamUpdate at the same level would leave in p,
// m and v, wherever the range starts and ends (tails run the vector code).
// What a speculative update writes into its second bank
// (offload/tier/tiered_state.h): full vectors go out with non-temporal
// stores where the outputs are aligned to a vector, since reading the output
// lines for ownership first would add a third to the memory traffic, and
// nothing reads them again soon.
struct AdamOutputs {
  float* p = nullptr;
  float* m = nullptr;
  float* v = nullptr;
};
void AdamUpdateBeside(const AdamStepConstants& c, TypedConstPtr grad, const float* p,
                      const float* m, const float* v, AdamOutputs out, TypedPtr low_precision,
                      size_t n, SimdLevel level);
void AdamUpdateBeside(const AdamStepConstants& c, TypedConstPtr grad, const float* p,
                      const float* m, const float* v, AdamOutputs out, TypedPtr low_precision,
                      size_t n);

// ---- Adagrad (torch.optim.Adagrad, lr_decay = 0, initial accumulator 0) ----

struct AdagradHyperParams {
  double lr = 1e-2;
  double eps = 1e-10;
  double weight_decay = 0.0;
};

struct AdagradStepConstants {
  float grad_scale;
  float lr;
  float eps;
  float weight_decay;  // L2: g += weight_decay * p
};
// Computed in double, rounded once.
AdagradStepConstants MakeAdagradStepConstants(const AdagradHyperParams& hp, double grad_scale);
//   g = grad * grad_scale + weight_decay * p;  sum += g*g;  p -= lr * g / (sqrt(sum) + eps)
void AdagradUpdate(const AdagradStepConstants& c, TypedConstPtr grad, float* p, float* sum,
                   TypedPtr low_precision, size_t n, SimdLevel level);
void AdagradUpdate(const AdagradStepConstants& c, TypedConstPtr grad, float* p, float* sum,
                   TypedPtr low_precision, size_t n);

// ---- Lion (Chen et al. 2023, as lion-pytorch and DeepSpeed define it) ----

struct LionHyperParams {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double weight_decay = 0.0;
};

struct LionStepConstants {
  float grad_scale;
  float lr;
  float beta1, beta2;  // the kernels weigh g by 1 - beta in fp32 (exact): weights sum to 1
  float decay_factor;  // p *= 1 - lr * weight_decay
};
// Computed in double, rounded once.
LionStepConstants MakeLionStepConstants(const LionHyperParams& hp, double grad_scale);
//   g = grad * grad_scale;  p *= decay_factor;
//   p -= lr * sign(beta1 * m + (1 - beta1) * g);  m = beta2 * m + (1 - beta2) * g
// sign is torch.sign: sign(+-0) = 0, sign(NaN) = NaN.
void LionUpdate(const LionStepConstants& c, TypedConstPtr grad, float* p, float* m,
                TypedPtr low_precision, size_t n, SimdLevel level);
void LionUpdate(const LionStepConstants& c, TypedConstPtr grad, float* p, float* m,
                TypedPtr low_precision, size_t n);

// ---- Gradient accumulation and statistics ----

// Sum of squares (accumulated in double lanes) and whether any value was
// NaN or +-Inf.
struct GradStats {
  double sum_squares = 0.0;
  bool non_finite = false;
};

// acc[i] = overwrite ? src[i] : acc[i] + src[i]. With `stats` non-null, also
// returns the statistics of the resulting acc values in the same pass (the
// last dp contribution of a step uses this, so the gradient is read once).
void AccumulateGradient(TypedConstPtr src, float* acc, size_t n, bool overwrite, GradStats* stats,
                        SimdLevel level);
void AccumulateGradient(TypedConstPtr src, float* acc, size_t n, bool overwrite, GradStats* stats);

// Statistics of an fp32 (or fp16/bf16) buffer on its own.
GradStats ComputeGradStats(TypedConstPtr src, size_t n, SimdLevel level);
GradStats ComputeGradStats(TypedConstPtr src, size_t n);

}  // namespace zo

#endif  // ZO_OFFLOAD_OPTIMIZER_KERNELS_H_
