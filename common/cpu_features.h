// What the host CPU (and the OS) lets us run, and which SIMD level the process
// dispatches to. Kernels elsewhere (conversion, CPU Adam) switch on
// ActiveSimdLevel() and keep one implementation per level.
//
//   switch (ActiveSimdLevel()) {
//     case SimdLevel::kAvx512: return FooAvx512(...);
//     case SimdLevel::kAvx2: return FooAvx2(...);
//     case SimdLevel::kScalar: return FooScalar(...);
//   }
//
// The environment variable ZO_SIMD=scalar|avx2|avx512 forces a level (tests,
// benchmarks); a level this CPU cannot run falls back, with one warning, to
// the best supported level below it.
#ifndef ZO_COMMON_CPU_FEATURES_H_
#define ZO_COMMON_CPU_FEATURES_H_

#include <ostream>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace zo {

// Instruction-set extensions usable by this process: the CPU reports them and,
// for the AVX families, the OS saves the wider register state (XCR0).
struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_bf16 = false;  // VCVTNEPS2BF16 and friends (Cooper Lake, Zen4+)
};

// Ordered: a higher level may use everything a lower one does.
enum class SimdLevel {
  kScalar = 0,  // baseline x86-64 (or any other CPU)
  kAvx2 = 1,    // AVX2 + FMA + F16C
  kAvx512 = 2,  // AVX-512 F/BW/VL/DQ + FMA + F16C; BF16 is optional inside it
};

inline constexpr SimdLevel kAllSimdLevels[] = {SimdLevel::kScalar, SimdLevel::kAvx2,
                                               SimdLevel::kAvx512};

// Runs cpuid/xgetbv now. All false on non-x86 targets. Thread-safe.
CpuFeatures DetectCpuFeatures();

// DetectCpuFeatures() of this host, computed once. Thread-safe.
const CpuFeatures& HostCpuFeatures();

// std::thread::hardware_concurrency() (at least 1), read once per process:
// glibc answers it by opening and reading /sys/devices/system/cpu/online on
// every call, which cost the data path two system calls a push.
int HostThreads();

// Pure: whether `features` can run every instruction `level` needs.
bool SimdLevelSupportedBy(SimdLevel level, const CpuFeatures& features);
// Pure: the highest level `features` supports.
SimdLevel BestSimdLevelFor(const CpuFeatures& features);

// The same two questions for this host.
bool SimdLevelSupported(SimdLevel level);
SimdLevel BestSimdLevel();

// "scalar", "avx2", "avx512".
std::string_view SimdLevelName(SimdLevel level);
// The name, for logs and test listings.
inline std::ostream& operator<<(std::ostream& os, SimdLevel level) {
  return os << SimdLevelName(level);
}

// Inverse of SimdLevelName, ignoring case and surrounding spaces.
// INVALID_ARGUMENT names the value and the accepted spellings.
absl::StatusOr<SimdLevel> ParseSimdLevel(const std::string& name);

// One line such as "avx2 fma f16c avx512f ..." listing the features present
// ("none" if none), for logs and benchmark context.
std::string CpuFeaturesString(const CpuFeatures& features);

// Outcome of resolving a ZO_SIMD value against a CPU.
struct SimdResolution {
  SimdLevel level;
  std::string warning;  // empty when the request was honoured as given
};

// Pure: the level to run given the raw ZO_SIMD value (nullptr or empty: not
// set -> best supported). An unsupported level resolves to the best supported
// level not above it; an unparsable value to the best supported level; both
// with a warning that says why.
SimdResolution ResolveSimdLevel(const char* env_value, const CpuFeatures& features);

// ResolveSimdLevel(getenv("ZO_SIMD"), HostCpuFeatures()), resolved once per
// process (logging its warning, if any, once). Always supported by the host.
// Thread-safe; cheap after the first call.
SimdLevel ActiveSimdLevel();

}  // namespace zo

#endif  // ZO_COMMON_CPU_FEATURES_H_
