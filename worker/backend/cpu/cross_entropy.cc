// Softmax cross-entropy over the last dimension: the mean loss (log-sum-exp)
// and its gradient.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/backend/cpu/internal/cpu_backend_impl.h"
#include "worker/backend/cpu/internal/pointwise_kernels.h"

namespace zo::backend::cpu {
namespace {

void CheckInputs(const char* op, const Tensor& logits, absl::Span<const int32_t> targets) {
  CheckShape(logits.rank() == 2 && logits.dim(0) == static_cast<int64_t>(targets.size()) &&
                 logits.dim(1) > 0,
             op, [&] {
               return absl::StrCat("logits ", ShapeString(logits.shape()), ", ", targets.size(),
                                   " targets");
             });
  const int64_t vocab = logits.dim(1);
  for (size_t r = 0; r < targets.size(); ++r) {
    CheckShape(targets[r] >= 0 && targets[r] < vocab, op, [&] {
      return absl::StrCat("target ", targets[r], " at row ", r, " outside [0, ", vocab,
                          ") of logits ", ShapeString(logits.shape()));
    });
  }
}

// A row's softmax: exp[i] = e^(row[i] − max) (max kept apart so that
// row[i] − max stays exact for large logits) and their sum.
struct Softmax {
  float max;
  float sum;
};

Softmax ExpRow(const float* row, int64_t n, float* exp) {
  const float max = *std::max_element(row, row + n);
  cpu_internal::ExpShifted(row, max, exp, n);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += exp[i];
  return Softmax{max, sum};
}

}  // namespace

Tensor CpuBackend::CrossEntropy(const Tensor& logits, absl::Span<const int32_t> targets) {
  CheckInputs("CrossEntropy", logits, targets);
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  double total = 0.0;  // rows can be many thousands; keep the sum exact enough
  std::vector<float> exp(static_cast<size_t>(vocab));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = Data(logits) + r * vocab;
    const Softmax z = ExpRow(row, vocab, exp.data());
    total += static_cast<double>(std::log(z.sum) - (row[targets[r]] - z.max));
  }
  Tensor loss = Empty(DType::kFloat32, {1});
  Data(loss)[0] = rows > 0 ? static_cast<float>(total / static_cast<double>(rows)) : 0.0f;
  return loss;
}

Tensor CpuBackend::CrossEntropyBackward(const Tensor& logits, absl::Span<const int32_t> targets,
                                        float scale) {
  CheckInputs("CrossEntropyBackward", logits, targets);
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  Tensor dlogits = Empty(logits.dtype(), logits.shape());
  const float s = rows > 0 ? scale / static_cast<float>(rows) : 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = Data(logits) + r * vocab;
    float* out = Data(dlogits) + r * vocab;
    const Softmax z = ExpRow(row, vocab, out);
    const float scale = s / z.sum;
    for (int64_t i = 0; i < vocab; ++i) out[i] *= scale;
    out[targets[r]] -= s;
  }
  RoundTo(dlogits.dtype(), Data(dlogits), dlogits.numel());
  return dlogits;
}

}  // namespace zo::backend::cpu
