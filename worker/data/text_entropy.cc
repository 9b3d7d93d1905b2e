#include "worker/data/text_entropy.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

namespace zo {
namespace {

// -sum p log2 p over `counts`, whose total is `total`.
double EntropyOfCounts(const uint64_t* counts, size_t n, uint64_t total) {
  if (total == 0) return 0.0;
  double h = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (counts[i] == 0) continue;
    const double p = static_cast<double>(counts[i]) / static_cast<double>(total);
    h -= p * std::log2(p);
  }
  return h;
}

}  // namespace

double UnigramEntropyBits(std::string_view text) {
  std::array<uint64_t, 256> counts{};
  for (char c : text) ++counts[static_cast<unsigned char>(c)];
  return EntropyOfCounts(counts.data(), counts.size(), text.size());
}

double BigramConditionalEntropyBits(std::string_view text) {
  if (text.size() < 2) return 0.0;
  // H(X_t | X_{t-1}) = H(X_{t-1}, X_t) - H(X_{t-1}), both over the same pairs.
  std::vector<uint64_t> pairs(256 * 256, 0);
  std::array<uint64_t, 256> prev{};
  for (size_t i = 1; i < text.size(); ++i) {
    const auto a = static_cast<unsigned char>(text[i - 1]);
    const auto b = static_cast<unsigned char>(text[i]);
    ++pairs[a * 256 + b];
    ++prev[a];
  }
  const uint64_t n = text.size() - 1;
  return EntropyOfCounts(pairs.data(), pairs.size(), n) -
         EntropyOfCounts(prev.data(), prev.size(), n);
}

}  // namespace zo
