#include "common/cpu_features.h"

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::IsOk;
using testing::StatusIs;

CpuFeatures NoFeatures() { return CpuFeatures{}; }

CpuFeatures Avx2Features() {
  CpuFeatures f;
  f.avx2 = f.fma = f.f16c = true;
  return f;
}

CpuFeatures AllFeatures() {
  CpuFeatures f = Avx2Features();
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = f.avx512_bf16 = true;
  return f;
}

TEST(SimdLevelTest, NamesRoundTrip) {
  for (SimdLevel level : kAllSimdLevels) {
    ZO_ASSERT_OK_AND_ASSIGN(SimdLevel parsed, ParseSimdLevel(std::string(SimdLevelName(level))));
    EXPECT_EQ(parsed, level);
  }
  EXPECT_EQ(SimdLevelName(SimdLevel::kAvx512), "avx512");
}

TEST(SimdLevelTest, ParseIgnoresCaseAndSpaces) {
  EXPECT_THAT(ParseSimdLevel(" AVX2 "), IsOk());
  EXPECT_EQ(*ParseSimdLevel(" AVX2 "), SimdLevel::kAvx2);
  EXPECT_EQ(*ParseSimdLevel("Scalar"), SimdLevel::kScalar);
}

TEST(SimdLevelTest, ParseRejectsUnknownNames) {
  EXPECT_THAT(ParseSimdLevel("avx3"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'avx3'"), HasSubstr("scalar, avx2 or avx512"))));
  EXPECT_THAT(ParseSimdLevel(""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("''")));
}

TEST(SimdLevelTest, SupportNeedsEveryRequiredFeature) {
  EXPECT_TRUE(SimdLevelSupportedBy(SimdLevel::kScalar, NoFeatures()));
  EXPECT_FALSE(SimdLevelSupportedBy(SimdLevel::kAvx2, NoFeatures()));
  EXPECT_TRUE(SimdLevelSupportedBy(SimdLevel::kAvx2, Avx2Features()));
  EXPECT_FALSE(SimdLevelSupportedBy(SimdLevel::kAvx512, Avx2Features()));
  EXPECT_TRUE(SimdLevelSupportedBy(SimdLevel::kAvx512, AllFeatures()));
  for (bool CpuFeatures::*member : {&CpuFeatures::avx2, &CpuFeatures::fma, &CpuFeatures::f16c}) {
    CpuFeatures f = Avx2Features();
    f.*member = false;
    EXPECT_FALSE(SimdLevelSupportedBy(SimdLevel::kAvx2, f));
  }
  for (bool CpuFeatures::*member :
       {&CpuFeatures::avx512f, &CpuFeatures::avx512bw, &CpuFeatures::avx512vl,
        &CpuFeatures::avx512dq, &CpuFeatures::f16c, &CpuFeatures::fma}) {
    CpuFeatures f = AllFeatures();
    f.*member = false;
    EXPECT_FALSE(SimdLevelSupportedBy(SimdLevel::kAvx512, f));
  }
  // BF16 is optional inside the AVX-512 level.
  CpuFeatures no_bf16 = AllFeatures();
  no_bf16.avx512_bf16 = false;
  EXPECT_TRUE(SimdLevelSupportedBy(SimdLevel::kAvx512, no_bf16));
}

TEST(SimdLevelTest, BestLevel) {
  EXPECT_EQ(BestSimdLevelFor(NoFeatures()), SimdLevel::kScalar);
  EXPECT_EQ(BestSimdLevelFor(Avx2Features()), SimdLevel::kAvx2);
  EXPECT_EQ(BestSimdLevelFor(AllFeatures()), SimdLevel::kAvx512);
}

TEST(ResolveSimdLevelTest, UnsetOrEmptyPicksBestWithoutWarning) {
  for (const char* value : {static_cast<const char*>(nullptr), "", "  "}) {
    SimdResolution r = ResolveSimdLevel(value, AllFeatures());
    EXPECT_EQ(r.level, SimdLevel::kAvx512);
    EXPECT_EQ(r.warning, "");
  }
  EXPECT_EQ(ResolveSimdLevel(nullptr, Avx2Features()).level, SimdLevel::kAvx2);
}

TEST(ResolveSimdLevelTest, SupportedForcedLevelIsHonoured) {
  SimdResolution r = ResolveSimdLevel("scalar", AllFeatures());
  EXPECT_EQ(r.level, SimdLevel::kScalar);
  EXPECT_EQ(r.warning, "");
  EXPECT_EQ(ResolveSimdLevel("avx2", AllFeatures()).level, SimdLevel::kAvx2);
  EXPECT_EQ(ResolveSimdLevel("AVX512", AllFeatures()).level, SimdLevel::kAvx512);
}

TEST(ResolveSimdLevelTest, UnsupportedLevelFallsBackBelowIt) {
  SimdResolution r = ResolveSimdLevel("avx512", Avx2Features());
  EXPECT_EQ(r.level, SimdLevel::kAvx2);
  EXPECT_THAT(r.warning, AllOf(HasSubstr("ZO_SIMD=avx512"), HasSubstr("not supported"),
                               HasSubstr("using avx2")));
  r = ResolveSimdLevel("avx2", NoFeatures());
  EXPECT_EQ(r.level, SimdLevel::kScalar);
  EXPECT_THAT(r.warning, AllOf(HasSubstr("ZO_SIMD=avx2"), HasSubstr("features: none"),
                               HasSubstr("using scalar")));
  // A CPU with AVX-512 but not the AVX2 set (hypothetical) still never runs
  // a level it lacks.
  CpuFeatures odd = AllFeatures();
  odd.avx2 = false;
  EXPECT_EQ(ResolveSimdLevel("avx2", odd).level, SimdLevel::kScalar);
}

TEST(ResolveSimdLevelTest, GarbageFallsBackToBestWithWarning) {
  SimdResolution r = ResolveSimdLevel("fastest", AllFeatures());
  EXPECT_EQ(r.level, SimdLevel::kAvx512);
  EXPECT_THAT(r.warning, AllOf(HasSubstr("'fastest'"), HasSubstr("using avx512")));
}

TEST(CpuFeaturesTest, FeaturesString) {
  EXPECT_EQ(CpuFeaturesString(NoFeatures()), "none");
  EXPECT_EQ(CpuFeaturesString(Avx2Features()), "avx2 fma f16c");
}

TEST(HostCpuFeaturesTest, IsConsistent) {
  const CpuFeatures& f = HostCpuFeatures();
  EXPECT_EQ(&f, &HostCpuFeatures());
  EXPECT_TRUE(SimdLevelSupported(BestSimdLevel()));
  EXPECT_TRUE(SimdLevelSupported(ActiveSimdLevel()));
  EXPECT_EQ(ActiveSimdLevel(), ResolveSimdLevel(std::getenv("ZO_SIMD"), f).level);
  EXPECT_TRUE(!f.avx512_bf16 || f.avx512f);
}

TEST(HostThreadsTest, IsTheHardwareConcurrencyAndAtLeastOne) {
  EXPECT_EQ(HostThreads(), std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  EXPECT_GE(HostThreads(), 1);
}

#if defined(__x86_64__)
// GCC's own detection (which also checks XCR0) as an independent witness.
TEST(HostCpuFeaturesTest, AgreesWithCompilerBuiltins) {
  __builtin_cpu_init();
  const CpuFeatures& f = HostCpuFeatures();
  EXPECT_EQ(f.avx2, __builtin_cpu_supports("avx2") != 0);
  EXPECT_EQ(f.fma, __builtin_cpu_supports("fma") != 0);
  EXPECT_EQ(f.avx512f, __builtin_cpu_supports("avx512f") != 0);
  EXPECT_EQ(f.avx512bw, __builtin_cpu_supports("avx512bw") != 0);
  EXPECT_EQ(f.avx512vl, __builtin_cpu_supports("avx512vl") != 0);
  EXPECT_EQ(f.avx512dq, __builtin_cpu_supports("avx512dq") != 0);
  EXPECT_EQ(f.avx512_bf16, __builtin_cpu_supports("avx512bf16") != 0);
}
#endif

}  // namespace
}  // namespace zo
