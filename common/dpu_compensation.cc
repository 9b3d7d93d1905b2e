#include "common/dpu_compensation.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace zo {
namespace {

// 1 - beta^count: Adam's bias correction after `count` applied steps.
double BiasCorrection(double beta, int64_t count, bool enabled) {
  return enabled ? 1.0 - std::pow(beta, static_cast<double>(count)) : 1.0;
}

}  // namespace

CompensationTerms TermsFor(const CompensationHyperParams& hp, const CompensatedStep& step,
                           int32_t tensor, int64_t elems, double v_sum) {
  CompensationTerms t;
  t.tensor = tensor;
  t.elems = elems;
  t.v_sum = v_sum;
  t.eps = hp.eps;
  if (step.skipped) return t;  // w_{s-2} is w_{s-1}: A 1, B and C 0
  const int64_t n = step.applied_before;
  const double c1_next = BiasCorrection(hp.beta1, n + 1, hp.bias_correction);
  const double c2_next = BiasCorrection(hp.beta2, n + 1, hp.bias_correction);
  t.keep = 1.0 - step.lr * hp.weight_decay;
  t.gain = step.grad_multiplier * step.lr * (1.0 - hp.beta1) / c1_next;
  t.inv_sqrt_bias2 = 1.0 / std::sqrt(c2_next);
  if (step.previous_lr.has_value() && *step.previous_lr > 0 && n >= 1) {
    const double c1 = BiasCorrection(hp.beta1, n, hp.bias_correction);
    const double c2 = BiasCorrection(hp.beta2, n, hp.bias_correction);
    t.momentum =
        hp.beta1 * (step.lr / *step.previous_lr) * (c1 / c1_next) * std::sqrt(c2_next / c2);
    t.previous_keep = 1.0 - *step.previous_lr * hp.weight_decay;
  }
  return t;
}

absl::StatusOr<WeightsCompensation> CombineTerms(absl::Span<const CompensationTerms> parts,
                                                 bool have_before) {
  if (parts.empty()) return absl::InvalidArgumentError("no server sent terms for the tensor");
  const CompensationTerms& first = parts.front();
  double v_sum = 0;
  int64_t elems = 0;
  for (const CompensationTerms& p : parts) {
    if (p.tensor != first.tensor || p.keep != first.keep || p.momentum != first.momentum ||
        p.previous_keep != first.previous_keep || p.gain != first.gain ||
        p.inv_sqrt_bias2 != first.inv_sqrt_bias2 || p.eps != first.eps) {
      return absl::InvalidArgumentError(
          absl::StrCat("the servers' compensation terms of tensor ", first.tensor,
                       " disagree (a server decided the step otherwise)"));
    }
    if (p.elems < 0 || !(p.v_sum >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("compensation terms of tensor ", p.tensor, ": negative elements or v"));
    }
    v_sum += p.v_sum;
    elems += p.elems;
  }
  WeightsCompensation w;
  w.last = first.keep;
  if (have_before) {
    w.last += first.momentum;
    w.before = -first.momentum * first.previous_keep;
  }
  // No v yet (no step applied to the tensor): no gain to scale the
  // gradient by; leave it out rather than divide by eps.
  const double v_mean = elems > 0 ? v_sum / static_cast<double>(elems) : 0.0;
  if (first.gain != 0 && v_mean > 0) {
    w.grad = first.gain / (std::sqrt(v_mean) * first.inv_sqrt_bias2 + first.eps);
  }
  return w;
}

}  // namespace zo
