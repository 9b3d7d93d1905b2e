#include "worker/model/param.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <thread>

#include "common/counter_rng.h"
#include "common/cpu_features.h"

namespace zo::model {
namespace {

// FNV-1a: a stable hash of the name (std::hash may differ between builds).
uint64_t NameHash(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// Uniform in (0, 1): 53 random bits, never 0 (Box-Muller takes a log).
double Unit(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53; }

}  // namespace

std::vector<float> InitialValues(const Param& param, uint64_t seed) {
  const int64_t n = param.numel();
  std::vector<float> values(static_cast<size_t>(n));
  const uint64_t key = NameHash(param.name);
  const double scale = param.init.scale;
  const auto fill = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      double v = scale;
      switch (param.init.kind) {
        case ParamInit::Kind::kConstant:
          break;
        case ParamInit::Kind::kUniform:
          v = scale * (2 * Unit(CounterRandom(seed, key, static_cast<uint64_t>(i))) - 1);
          break;
        case ParamInit::Kind::kNormal: {
          const double u1 = Unit(CounterRandom(seed, key, static_cast<uint64_t>(i), 1));
          const double u2 = Unit(CounterRandom(seed, key, static_cast<uint64_t>(i), 2));
          v = scale * std::sqrt(-2 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2);
          break;
        }
      }
      values[static_cast<size_t>(i)] = static_cast<float>(v);
    }
  };
  // Each element is a function of its index alone, so threads split the
  // tensor without changing a bit; a billion-parameter model starts in
  // seconds instead of minutes.
  constexpr int64_t kPerThread = int64_t{1} << 20;
  const int64_t threads = std::clamp<int64_t>(n / kPerThread, 1, HostThreads());
  if (threads == 1) {
    fill(0, n);
    return values;
  }
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) {
    pool.emplace_back(fill, n * t / threads, n * (t + 1) / threads);
  }
  for (std::thread& t : pool) t.join();
  return values;
}

}  // namespace zo::model
