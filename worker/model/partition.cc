#include "worker/model/partition.h"

#include <algorithm>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace zo::model {
namespace {

// Cuts the layers into exactly `parts` contiguous non-empty pieces, each
// taking as many layers as fit under `limit` while leaving one layer for each
// later piece. With non-negative weights this greedy cut fits under the
// limit whenever any cut does. Empty when none does.
std::vector<int> Pack(const std::vector<int64_t>& w, int parts, int64_t limit) {
  const int n = static_cast<int>(w.size());
  std::vector<int> bounds = {0};
  int i = 0;
  for (int part = 1; part <= parts; ++part) {
    const int max_end = part == parts ? n : n - (parts - part);
    int64_t sum = w[i++];  // non-empty
    while (i < max_end && (part == parts || sum + w[i] <= limit)) sum += w[i++];
    if (sum > limit) return {};
    bounds.push_back(i);
  }
  return bounds;
}

}  // namespace

std::vector<int> BalancedBoundaries(const std::vector<int64_t>& w, int parts) {
  int64_t lo = 0;
  int64_t hi = 0;
  for (int64_t x : w) {
    lo = std::max(lo, x);
    hi += x;
  }
  while (lo < hi) {  // the smallest bottleneck a cut reaches
    const int64_t mid = lo + (hi - lo) / 2;
    if (Pack(w, parts, mid).empty())
      lo = mid + 1;
    else
      hi = mid;
  }
  return Pack(w, parts, lo);
}

absl::StatusOr<std::vector<int>> PartitionLayers(const std::vector<LayerWeightInfo>& layers,
                                                 int parts, const std::string& method) {
  const int n = static_cast<int>(layers.size());
  if (parts < 1)
    return absl::InvalidArgumentError(absl::StrCat("stages must be >= 1, got ", parts));
  if (parts > n) {
    return absl::InvalidArgumentError(absl::StrCat("cannot cut ", n, " layers into ", parts,
                                                   " pipeline stages: each needs a layer"));
  }
  std::vector<int64_t> weights(layers.size());
  if (method == "parameters") {
    for (int i = 0; i < n; ++i) weights[i] = layers[i].param_count;
  } else if (method == "uniform") {
    // DeepSpeed's partition_uniform: floor(n / parts) each, the first
    // n mod parts parts one more.
    std::vector<int> bounds = {0};
    for (int p = 0; p < parts; ++p) bounds.push_back(bounds.back() + n / parts + (p < n % parts));
    return bounds;
  } else if (absl::StartsWithIgnoreCase(method, "type:")) {
    const std::string pattern(method.substr(5));
    std::regex re;
    try {
      re = std::regex(pattern, std::regex::ECMAScript | std::regex::icase);
    } catch (const std::regex_error& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition method '", method, "': bad regular expression: ", e.what()));
    }
    int matched = 0;
    for (int i = 0; i < n; ++i) {
      weights[i] = std::regex_search(layers[i].type, re) ? 1 : 0;
      matched += static_cast<int>(weights[i]);
    }
    if (matched == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition method '", method, "': no layer type matches '", pattern, "'"));
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown partition method '", method,
                                                   "' (parameters, uniform or type:REGEX)"));
  }
  return BalancedBoundaries(weights, parts);
}

}  // namespace zo::model
