// A synthetic training problem whose gradient is exact, and an independent
// double-precision reference of what the offload tier must compute with it.
//
// Loss of dp rank r: 1/(2 m) * ||A_r x - b_r||^2 over its m rows, so
// g_r = A_r^T (A_r x - b_r) / m. The servers average the dp gradients, clip by
// the global norm (DeepSpeed's rule), take the lr from WarmupLR and run AdamW
// (torch semantics). Reference runs the same in double, from the gradients
// the workers actually push (computed on the weights they pulled and rounded
// to the job's dtype), so it differs from the servers only by the servers'
// fp32 arithmetic.
#ifndef ZO_TESTS_SERVER_LEAST_SQUARES_H_
#define ZO_TESTS_SERVER_LEAST_SQUARES_H_

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "common/bf16.h"
#include "common/dtype.h"
#include "common/fp16.h"

namespace zo::testing {

struct LeastSquares {
  int n = 0;  // parameters
  int m = 0;  // rows per dp rank
  int dp = 0;
  std::vector<int> tensor_sizes;       // they tile [0, n)
  std::vector<std::vector<double>> a;  // per rank, m x n row-major
  std::vector<std::vector<double>> b;  // per rank, m
  std::vector<float> x0;

  static LeastSquares Make(std::vector<int> tensor_sizes, int rows_per_rank, int dp,
                           uint32_t seed) {
    LeastSquares p;
    p.tensor_sizes = std::move(tensor_sizes);
    for (int s : p.tensor_sizes) p.n += s;
    p.m = rows_per_rank;
    p.dp = dp;
    std::mt19937 rng(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<double> x_true(p.n);
    for (double& v : x_true) v = normal(rng);
    for (int r = 0; r < dp; ++r) {
      std::vector<double> a(static_cast<size_t>(p.m) * p.n), b(p.m);
      for (double& v : a) v = normal(rng) / std::sqrt(static_cast<double>(p.n));
      for (int i = 0; i < p.m; ++i) {
        double dot = 0;
        for (int j = 0; j < p.n; ++j) dot += a[static_cast<size_t>(i) * p.n + j] * x_true[j];
        b[i] = dot + 0.1 * normal(rng);
      }
      p.a.push_back(std::move(a));
      p.b.push_back(std::move(b));
    }
    p.x0.resize(p.n);
    for (float& v : p.x0) v = static_cast<float>(0.5 * normal(rng));
    return p;
  }

  int TensorBegin(int t) const {
    int begin = 0;
    for (int i = 0; i < t; ++i) begin += tensor_sizes[i];
    return begin;
  }

  // g_r at weights x, in double.
  std::vector<double> Gradient(int rank, const std::vector<float>& x) const {
    std::vector<double> g(n, 0.0);
    const std::vector<double>& a_r = a[rank];
    for (int i = 0; i < m; ++i) {
      const double* row = &a_r[static_cast<size_t>(i) * n];
      double residual = -b[rank][i];
      for (int j = 0; j < n; ++j) residual += row[j] * x[j];
      for (int j = 0; j < n; ++j) g[j] += row[j] * residual / m;
    }
    return g;
  }

  double Loss(const std::vector<float>& x) const {
    double loss = 0;
    for (int r = 0; r < dp; ++r) {
      for (int i = 0; i < m; ++i) {
        double residual = -b[r][i];
        for (int j = 0; j < n; ++j) residual += a[r][static_cast<size_t>(i) * n + j] * x[j];
        loss += residual * residual / (2.0 * m * dp);
      }
    }
    return loss;
  }
};

// Rounds v to the job's dtype and back.
inline float RoundTo(DType dtype, float v) {
  switch (dtype) {
    case DType::kFloat16:
      return HalfBitsToFloat(FloatToHalfBits(v));
    case DType::kBFloat16:
      return Bf16BitsToFloat(FloatToBf16Bits(v));
    case DType::kFloat32:
      return v;
  }
  return v;
}

struct ReferenceOptions {
  double lr_min = 0.0, lr_max = 0.01;  // WarmupLR, linear
  int warmup_steps = 10;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  double clipping = 0.0;
  bool dpu = false;
  int dpu_warmup = 0;
  DType dtype = DType::kFloat32;
};

// AdamW over the dp-averaged, clipped gradient, in double. Steps count from 1;
// `skip` marks steps the servers must skip (overflow injected there).
class Reference {
 public:
  Reference(const LeastSquares& p, ReferenceOptions o) : p_(p), o_(o) {
    master_.assign(p.x0.begin(), p.x0.end());
    m_.assign(p.n, 0.0);
    v_.assign(p.n, 0.0);
    versions_[0] = Weights();
  }

  // The weights workers see for version `version` (rounded to the dtype).
  std::vector<float> Weights() const {
    std::vector<float> w(p_.n);
    for (int i = 0; i < p_.n; ++i) w[i] = RoundTo(o_.dtype, static_cast<float>(master_[i]));
    return w;
  }
  const std::vector<double>& master() const { return master_; }

  int64_t VersionFor(int64_t step) const {
    const bool delayed = o_.dpu && step > o_.dpu_warmup + 1;
    return delayed ? step - 2 : step - 1;
  }

  // What rank r pushes for `step` at loss scale `scale`, as fp32 values.
  std::vector<float> Pushed(int rank, const std::vector<float>& weights, double scale) const {
    const std::vector<double> g = p_.Gradient(rank, weights);
    std::vector<float> out(p_.n);
    for (int i = 0; i < p_.n; ++i) out[i] = RoundTo(o_.dtype, static_cast<float>(g[i] * scale));
    return out;
  }

  void Step(int64_t step, bool skip, double scale) {
    if (!skip) {
      const std::vector<float>& w = versions_.at(VersionFor(step));
      std::vector<double> g(p_.n, 0.0);
      for (int r = 0; r < p_.dp; ++r) {
        const std::vector<float> pushed = Pushed(r, w, scale);
        for (int i = 0; i < p_.n; ++i) g[i] += pushed[i];
      }
      double sum = 0;
      for (double x : g) sum += x * x;
      const double norm = std::sqrt(sum) / (p_.dp * scale);
      double combined = p_.dp * scale;
      if (o_.clipping > 0) {
        const double clip = (norm + 1e-6) / o_.clipping;
        if (clip > 1) combined *= clip;
      }
      // WarmupLR (linear): applied step k runs at DeepSpeed's iteration k - 2.
      const int64_t k = ++applied_;
      const int64_t iteration = k - 2;
      const int w_steps = std::max(o_.warmup_steps, 2);
      double lr = o_.lr_min;
      if (iteration >= 0) {
        lr = iteration < w_steps ? o_.lr_min + (o_.lr_max - o_.lr_min) * iteration / w_steps
                                 : o_.lr_max;
      }
      const double bc1 = 1 - std::pow(o_.beta1, k);
      const double bc2 = 1 - std::pow(o_.beta2, k);
      for (int i = 0; i < p_.n; ++i) {
        const double gi = g[i] / combined;
        master_[i] *= 1 - lr * o_.weight_decay;
        m_[i] = o_.beta1 * m_[i] + (1 - o_.beta1) * gi;
        v_[i] = o_.beta2 * v_[i] + (1 - o_.beta2) * gi * gi;
        master_[i] -= lr / bc1 * m_[i] / (std::sqrt(v_[i]) / std::sqrt(bc2) + o_.eps);
      }
    }
    versions_[step] = Weights();
  }

 private:
  const LeastSquares& p_;
  ReferenceOptions o_;
  std::vector<double> master_, m_, v_;
  int64_t applied_ = 0;
  std::map<int64_t, std::vector<float>> versions_;
};

}  // namespace zo::testing

#endif  // ZO_TESTS_SERVER_LEAST_SQUARES_H_
