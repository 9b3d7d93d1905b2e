// Timing and summary helpers shared by the zo-bench workloads.
#ifndef ZO_BENCH_INTERNAL_BENCH_STATS_H_
#define ZO_BENCH_INTERNAL_BENCH_STATS_H_

#include <algorithm>
#include <chrono>
#include <vector>

namespace zo::bench_internal {

// Seconds since `start` on the steady clock.
inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Median of a non-empty sample (the mean of the middle two for an even count).
inline double Median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const size_t h = x.size() / 2;
  return x.size() % 2 ? x[h] : 0.5 * (x[h - 1] + x[h]);
}

// A sample's median and range.
struct Summary {
  double median = 0;
  double min = 0;
  double max = 0;
};

inline Summary Summarize(const std::vector<double>& x) {
  return {Median(x), *std::min_element(x.begin(), x.end()), *std::max_element(x.begin(), x.end())};
}

}  // namespace zo::bench_internal

#endif  // ZO_BENCH_INTERNAL_BENCH_STATS_H_
