// Test only: double-precision scalar references for the CPU backend's ops
// (straightforward loops, no BLAS), the ground truth of cpu/ops_test.cc for
// forwards and, through finite differences, for backwards.
#ifndef ZO_WORKER_BACKEND_CPU_INTERNAL_REFERENCE_OPS_H_
#define ZO_WORKER_BACKEND_CPU_INTERNAL_REFERENCE_OPS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace zo::backend::cpu_internal::reference {

using Vec = std::vector<double>;

// y[rows, out] = x[rows, in] · w[out, in]^T + b[out] (b may be null).
inline Vec Linear(const Vec& x, const Vec& w, const Vec* b, int rows, int in, int out) {
  Vec y(static_cast<size_t>(rows) * out);
  for (int r = 0; r < rows; ++r) {
    for (int o = 0; o < out; ++o) {
      double s = b != nullptr ? (*b)[o] : 0.0;
      for (int i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = s;
    }
  }
  return y;
}

inline Vec Embedding(const std::vector<int32_t>& tokens, int block_size, const Vec& wte,
                     const Vec& wpe, int c) {
  Vec y(tokens.size() * c);
  for (size_t r = 0; r < tokens.size(); ++r) {
    for (int i = 0; i < c; ++i) {
      y[r * c + i] = wte[tokens[r] * c + i] + wpe[(r % block_size) * c + i];
    }
  }
  return y;
}

struct LayerNormResult {
  Vec y, mean, rstd;
};

inline LayerNormResult LayerNorm(const Vec& x, const Vec& gamma, const Vec& beta, double eps,
                                 int rows, int c) {
  LayerNormResult out{Vec(x.size()), Vec(rows), Vec(rows)};
  for (int r = 0; r < rows; ++r) {
    double mean = 0.0;
    for (int i = 0; i < c; ++i) mean += x[r * c + i];
    mean /= c;
    double var = 0.0;
    for (int i = 0; i < c; ++i) var += (x[r * c + i] - mean) * (x[r * c + i] - mean);
    var /= c;
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (int i = 0; i < c; ++i) {
      out.y[r * c + i] = (x[r * c + i] - mean) * rstd * gamma[i] + beta[i];
    }
    out.mean[r] = mean;
    out.rstd[r] = rstd;
  }
  return out;
}

inline Vec Gelu(const Vec& x) {
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = 0.5 * x[i] * (1.0 + std::erf(x[i] / std::sqrt(2.0)));
  return y;
}

inline Vec Relu(const Vec& x) {
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = std::max(x[i], 0.0);
  return y;
}

inline Vec Add(const Vec& a, const Vec& b) {
  Vec y(a.size());
  for (size_t i = 0; i < a.size(); ++i) y[i] = a[i] + b[i];
  return y;
}

struct AttentionResult {
  Vec y;    // [batch * t, c]
  Vec lse;  // [batch, heads, t]: log-sum-exp of each row's scaled scores
};

// Causal multi-head attention over qkv [batch * t, 3c], as backend.h defines it.
inline AttentionResult Attention(const Vec& qkv, int batch, int t, int c, int heads) {
  const int d = c / heads;
  AttentionResult out{Vec(static_cast<size_t>(batch) * t * c, 0.0),
                      Vec(static_cast<size_t>(batch) * heads * t, 0.0)};
  auto at = [&](int b, int pos, int col) { return qkv[(b * t + pos) * 3 * c + col]; };
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < t; ++i) {
        std::vector<double> s(i + 1);
        double max = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int e = 0; e < d; ++e) dot += at(b, i, h * d + e) * at(b, j, c + h * d + e);
          s[j] = dot / std::sqrt(static_cast<double>(d));
          max = std::max(max, s[j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= i; ++j) sum += std::exp(s[j] - max);
        out.lse[(b * heads + h) * t + i] = max + std::log(sum);
        for (int j = 0; j <= i; ++j) {
          const double p = std::exp(s[j] - max) / sum;
          for (int e = 0; e < d; ++e) {
            out.y[(b * t + i) * c + h * d + e] += p * at(b, j, 2 * c + h * d + e);
          }
        }
      }
    }
  }
  return out;
}

// Mean over rows of logsumexp(logits[r]) - logits[r][targets[r]].
inline double CrossEntropy(const Vec& logits, const std::vector<int32_t>& targets, int vocab) {
  double total = 0.0;
  for (size_t r = 0; r < targets.size(); ++r) {
    const double* row = logits.data() + r * vocab;
    const double max = *std::max_element(row, row + vocab);
    double sum = 0.0;
    for (int i = 0; i < vocab; ++i) sum += std::exp(row[i] - max);
    total += max + std::log(sum) - row[targets[r]];
  }
  return total / static_cast<double>(targets.size());
}

}  // namespace zo::backend::cpu_internal::reference

#endif  // ZO_WORKER_BACKEND_CPU_INTERNAL_REFERENCE_OPS_H_
