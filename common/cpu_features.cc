#include "common/cpu_features.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define ZO_CPU_FEATURES_X86 1
#endif

namespace zo {
namespace {

#ifdef ZO_CPU_FEATURES_X86

// XCR0 bits: which register state the OS saves on context switch.
constexpr uint64_t kXcr0Sse = 1u << 1;
constexpr uint64_t kXcr0Ymm = 1u << 2;
constexpr uint64_t kXcr0Opmask = 1u << 5;
constexpr uint64_t kXcr0ZmmHi256 = 1u << 6;
constexpr uint64_t kXcr0Hi16Zmm = 1u << 7;

// Inline asm rather than _xgetbv(), which needs -mxsave on this file.
uint64_t ReadXcr0() {
  uint32_t eax = 0;
  uint32_t edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

bool Bit(uint32_t reg, int bit) { return ((reg >> bit) & 1u) != 0; }

#endif  // ZO_CPU_FEATURES_X86

// Our Abseil's StrCat takes absl::string_view, which is not std::string_view.
std::string NameOf(SimdLevel level) { return std::string(SimdLevelName(level)); }

}  // namespace

CpuFeatures DetectCpuFeatures() {
  CpuFeatures f;
#ifdef ZO_CPU_FEATURES_X86
  uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
  const uint32_t max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 1 || !__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  const bool osxsave = Bit(ecx, 27);
  const bool avx = Bit(ecx, 28);
  if (!osxsave || !avx) return f;  // no AVX state at all: everything stays off
  const uint64_t xcr0 = ReadXcr0();
  const bool os_ymm = (xcr0 & (kXcr0Sse | kXcr0Ymm)) == (kXcr0Sse | kXcr0Ymm);
  const uint64_t zmm_bits = kXcr0Opmask | kXcr0ZmmHi256 | kXcr0Hi16Zmm;
  const bool os_zmm = os_ymm && (xcr0 & zmm_bits) == zmm_bits;
  if (!os_ymm) return f;
  f.fma = Bit(ecx, 12);
  f.f16c = Bit(ecx, 29);
  if (max_leaf < 7) return f;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const uint32_t max_subleaf7 = eax;
  f.avx2 = Bit(ebx, 5);
  if (os_zmm) {
    f.avx512f = Bit(ebx, 16);
    f.avx512dq = Bit(ebx, 17);
    f.avx512bw = Bit(ebx, 30);
    f.avx512vl = Bit(ebx, 31);
    if (max_subleaf7 >= 1) {
      __cpuid_count(7, 1, eax, ebx, ecx, edx);
      f.avx512_bf16 = f.avx512f && Bit(eax, 5);
    }
  }
#endif
  return f;
}

const CpuFeatures& HostCpuFeatures() {
  static const CpuFeatures features = DetectCpuFeatures();
  return features;
}

bool SimdLevelSupportedBy(SimdLevel level, const CpuFeatures& f) {
  switch (level) {
    case SimdLevel::kScalar:
      return true;
    case SimdLevel::kAvx2:
      return f.avx2 && f.fma && f.f16c;
    case SimdLevel::kAvx512:
      return f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma && f.f16c;
  }
  return false;
}

SimdLevel BestSimdLevelFor(const CpuFeatures& features) {
  SimdLevel best = SimdLevel::kScalar;
  for (SimdLevel level : kAllSimdLevels) {
    if (SimdLevelSupportedBy(level, features)) best = level;
  }
  return best;
}

bool SimdLevelSupported(SimdLevel level) { return SimdLevelSupportedBy(level, HostCpuFeatures()); }

SimdLevel BestSimdLevel() { return BestSimdLevelFor(HostCpuFeatures()); }

std::string_view SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "?";
}

absl::StatusOr<SimdLevel> ParseSimdLevel(const std::string& name) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(name));
  for (SimdLevel level : kAllSimdLevels) {
    if (lower == SimdLevelName(level)) return level;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown SIMD level '", name, "'; expected scalar, avx2 or avx512"));
}

std::string CpuFeaturesString(const CpuFeatures& f) {
  std::vector<std::string> names;
  if (f.avx2) names.push_back("avx2");
  if (f.fma) names.push_back("fma");
  if (f.f16c) names.push_back("f16c");
  if (f.avx512f) names.push_back("avx512f");
  if (f.avx512bw) names.push_back("avx512bw");
  if (f.avx512vl) names.push_back("avx512vl");
  if (f.avx512dq) names.push_back("avx512dq");
  if (f.avx512_bf16) names.push_back("avx512_bf16");
  return names.empty() ? "none" : absl::StrJoin(names, " ");
}

SimdResolution ResolveSimdLevel(const char* env_value, const CpuFeatures& features) {
  const SimdLevel best = BestSimdLevelFor(features);
  if (env_value == nullptr || absl::StripAsciiWhitespace(env_value).empty()) {
    return {best, ""};
  }
  absl::StatusOr<SimdLevel> requested = ParseSimdLevel(env_value);
  if (!requested.ok()) {
    return {best,
            absl::StrCat("ZO_SIMD: ", requested.status().message(), "; using ", NameOf(best))};
  }
  if (SimdLevelSupportedBy(*requested, features)) return {*requested, ""};
  SimdLevel fallback = SimdLevel::kScalar;
  for (SimdLevel level : kAllSimdLevels) {
    if (level <= *requested && SimdLevelSupportedBy(level, features)) fallback = level;
  }
  return {fallback,
          absl::StrCat("ZO_SIMD=", NameOf(*requested), " is not supported by this CPU (features: ",
                       CpuFeaturesString(features), "); using ", NameOf(fallback))};
}

int HostThreads() {
  static const int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return threads;
}

SimdLevel ActiveSimdLevel() {
  static const SimdLevel level = [] {
    SimdResolution r = ResolveSimdLevel(std::getenv("ZO_SIMD"), HostCpuFeatures());
    if (!r.warning.empty()) ZO_LOG(WARNING) << r.warning;
    return r.level;
  }();
  return level;
}

}  // namespace zo
