// Step constants that differ by element range: parameter groups with their
// own learning rate, betas, eps or weight decay (torch.optim's
// param_groups) laid over one flat state. Runs are half-open and cover the
// state from 0 in ascending order; the last run extends to the end.
//
//   RangedConstants<AdamStepConstants> c({{0, decayed}, {4096, not_decayed}});
//   c.ForEach(begin, end, [&](int64_t b, int64_t e, const AdamStepConstants& k) { ... });
//
// A value type; immutable once built, so safe to share between threads.
#ifndef ZO_OFFLOAD_RANGED_CONSTANTS_H_
#define ZO_OFFLOAD_RANGED_CONSTANTS_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace zo {

template <typename T>
class RangedConstants {
 public:
  struct Run {
    int64_t begin = 0;
    T constants;
  };

  // One run over everything.
  explicit RangedConstants(T constants) : runs_{{0, std::move(constants)}} {}
  // `runs` non-empty, runs[0].begin == 0, begins strictly ascending (the
  // caller builds them from a layout; not checked beyond debug builds).
  explicit RangedConstants(std::vector<Run> runs) : runs_(std::move(runs)) {}

  const std::vector<Run>& runs() const { return runs_; }

  // Calls fn(b, e, constants) for each run's part of [begin, end), in order.
  template <typename F>
  void ForEach(int64_t begin, int64_t end, F&& fn) const {
    if (begin >= end) return;
    // The last run beginning at or before `begin`.
    auto it = std::upper_bound(runs_.begin(), runs_.end(), begin,
                               [](int64_t at, const Run& r) { return at < r.begin; });
    --it;
    for (; it != runs_.end() && it->begin < end; ++it) {
      const int64_t b = std::max(begin, it->begin);
      const int64_t e = (it + 1 == runs_.end()) ? end : std::min(end, (it + 1)->begin);
      if (b < e) fn(b, e, it->constants);
    }
  }

 private:
  std::vector<Run> runs_;
};

}  // namespace zo

#endif  // ZO_OFFLOAD_RANGED_CONSTANTS_H_
