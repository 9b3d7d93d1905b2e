#include "common/convert.h"

#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/cpu_features.h"
#include "common/fp16.h"
#include "common/internal/convert_kernels.h"
#include "gtest/gtest.h"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace zo {
namespace {

using ToLow = std::function<void(const float*, uint16_t*, size_t)>;
using FromLow = std::function<void(const uint16_t*, float*, size_t)>;

// One way to run the four conversions. Besides each SimdLevel through the
// public API, the AVX-512 bf16 kernel is run both with and without
// VCVTNEPS2BF16, so either variant is tested on a host that has it.
struct Path {
  std::string name;
  SimdLevel level;       // the host must support it
  bool needs_bf16_insn;  // and AVX512-BF16, if set
  ToLow to_half, to_bf16;
  FromLow from_half, from_bf16;
};

// Keeps test names and failure messages readable.
void PrintTo(const Path& path, std::ostream* os) { *os << path.name; }

Path LevelPath(SimdLevel level) {
  return {std::string(SimdLevelName(level)),
          level,
          false,
          [level](const float* s, uint16_t* d, size_t n) { FloatToHalf(s, d, n, level); },
          [level](const float* s, uint16_t* d, size_t n) { FloatToBf16(s, d, n, level); },
          [level](const uint16_t* s, float* d, size_t n) { HalfToFloat(s, d, n, level); },
          [level](const uint16_t* s, float* d, size_t n) { Bf16ToFloat(s, d, n, level); }};
}

Path Avx512Bf16Path(bool use_insn) {
  Path p = LevelPath(SimdLevel::kAvx512);
  p.name = use_insn ? "avx512_bf16insn" : "avx512_intbf16";
  p.needs_bf16_insn = use_insn;
  p.to_bf16 = [use_insn](const float* s, uint16_t* d, size_t n) {
    common_internal::FloatToBf16Avx512(s, d, n, use_insn);
  };
  return p;
}

Path DispatchedPath() {
  return {"dispatched",
          SimdLevel::kScalar,
          false,
          [](const float* s, uint16_t* d, size_t n) { FloatToHalf(s, d, n); },
          [](const float* s, uint16_t* d, size_t n) { FloatToBf16(s, d, n); },
          [](const uint16_t* s, float* d, size_t n) { HalfToFloat(s, d, n); },
          [](const uint16_t* s, float* d, size_t n) { Bf16ToFloat(s, d, n); }};
}

std::vector<Path> AllPaths() {
  std::vector<Path> paths;
  for (SimdLevel level : kAllSimdLevels) paths.push_back(LevelPath(level));
  paths.push_back(Avx512Bf16Path(false));
  paths.push_back(Avx512Bf16Path(true));
  paths.push_back(DispatchedPath());
  return paths;
}

float FromBits(uint32_t b) { return std::bit_cast<float>(b); }

// Floats where rounding is hard: every finite fp16 and bf16 value, the exact
// midpoints to their neighbours and one fp32 ulp either side of those, plus
// NaNs with assorted payloads and random bit patterns.
std::vector<float> HardFloats() {
  std::vector<float> out;
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = HalfBitsToFloat(static_cast<uint16_t>(h));
    const uint32_t b = std::bit_cast<uint32_t>(f);
    out.push_back(f);
    if ((h & 0x7C00) == 0x7C00) continue;
    // The midpoint to the next half up in magnitude sits 2^12 fp32 ulps above
    // for normals; for subnormals compute it in float (exact there).
    const float next = HalfBitsToFloat(static_cast<uint16_t>(h + 1));
    const float mid = (h & 0x7FFF) == 0x7BFF ? (f < 0 ? -65520.0f : 65520.0f) : (f + next) / 2;
    const uint32_t m = std::bit_cast<uint32_t>(mid);
    for (uint32_t x : {m - 1, m, m + 1, b + 1, b - 1}) out.push_back(FromBits(x));
  }
  for (uint32_t hi = 0; hi <= 0xFFFF; ++hi) {
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      out.push_back(FromBits((hi << 16) | lo));
    }
  }
  std::mt19937 rng(99);
  for (int i = 0; i < 200000; ++i) out.push_back(FromBits(static_cast<uint32_t>(rng())));
  return out;
}

// Index of the first difference, or -1.
template <typename T>
int64_t FirstMismatch(const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(T)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

class ConvertTest : public ::testing::TestWithParam<Path> {
 protected:
  void SetUp() override {
    const Path& p = GetParam();
    if (!SimdLevelSupported(p.level)) GTEST_SKIP() << SimdLevelName(p.level) << " not supported";
    if (p.needs_bf16_insn && !HostCpuFeatures().avx512_bf16) {
      GTEST_SKIP() << "no AVX512-BF16 on this CPU";
    }
  }
};

TEST_P(ConvertTest, FloatToLowMatchesScalarOnHardValues) {
  const std::vector<float> src = HardFloats();
  std::vector<uint16_t> want_half(src.size()), want_bf16(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    want_half[i] = FloatToHalfBits(src[i]);
    want_bf16[i] = FloatToBf16Bits(src[i]);
  }
  std::vector<uint16_t> got(src.size());
  GetParam().to_half(src.data(), got.data(), src.size());
  int64_t bad = FirstMismatch(got.data(), want_half.data(), src.size());
  EXPECT_EQ(bad, -1) << std::hex << "fp16 of float bits 0x" << std::bit_cast<uint32_t>(src[bad]);
  GetParam().to_bf16(src.data(), got.data(), src.size());
  bad = FirstMismatch(got.data(), want_bf16.data(), src.size());
  EXPECT_EQ(bad, -1) << std::hex << "bf16 of float bits 0x" << std::bit_cast<uint32_t>(src[bad]);
}

TEST_P(ConvertTest, LowToFloatMatchesScalarOnAllBitPatterns) {
  std::vector<uint16_t> src(1 << 16);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(i);
  std::vector<float> want(src.size()), got(src.size());
  for (size_t i = 0; i < src.size(); ++i) want[i] = HalfBitsToFloat(src[i]);
  GetParam().from_half(src.data(), got.data(), src.size());
  EXPECT_EQ(FirstMismatch(got.data(), want.data(), src.size()), -1);
  for (size_t i = 0; i < src.size(); ++i) want[i] = Bf16BitsToFloat(src[i]);
  GetParam().from_bf16(src.data(), got.data(), src.size());
  EXPECT_EQ(FirstMismatch(got.data(), want.data(), src.size()), -1);
}

// Runs all four directions on n elements whose src and dst start `src_off`
// and `dst_off` bytes into byte buffers (any offset: the API needs no
// alignment), checking results and that no byte outside dst changed.
void CheckAtByteOffsets(const Path& p, const std::vector<float>& pool, size_t n, size_t src_off,
                        size_t dst_off) {
  constexpr size_t kGuard = 64;
  constexpr unsigned char kFill = 0xA5;
  SCOPED_TRACE(::testing::Message()
               << "n=" << n << " src_off=" << src_off << " dst_off=" << dst_off);
  std::vector<float> in_f(n);
  std::vector<uint16_t> in_h(n);
  for (size_t i = 0; i < n; ++i) {
    in_f[i] = pool[(i * 7919) % pool.size()];
    in_h[i] = static_cast<uint16_t>(i * 40503u);
  }
  auto run = [&](const void* in, size_t in_size, size_t out_size, auto expected, auto convert) {
    std::vector<unsigned char> src_buf(src_off + n * in_size + 1);
    std::vector<unsigned char> dst_buf(kGuard + dst_off + n * out_size + kGuard, kFill);
    if (n > 0) std::memcpy(src_buf.data() + src_off, in, n * in_size);
    unsigned char* dst = dst_buf.data() + kGuard + dst_off;
    convert(src_buf.data() + src_off, dst);
    for (size_t i = 0; i < n; ++i) {
      auto want = expected(i);
      ASSERT_EQ(std::memcmp(dst + i * out_size, &want, out_size), 0) << "element " << i;
    }
    for (size_t i = 0; i < kGuard + dst_off; ++i) ASSERT_EQ(dst_buf[i], kFill) << "before dst";
    for (size_t i = kGuard + dst_off + n * out_size; i < dst_buf.size(); ++i) {
      ASSERT_EQ(dst_buf[i], kFill) << "after dst";
    }
  };
  // The void pointers are handed on as typed pointers without being
  // dereferenced here; the API itself accesses them unaligned.
  auto to_half = [&](const void* s, void* d) {
    p.to_half(static_cast<const float*>(s), static_cast<uint16_t*>(d), n);
  };
  auto to_bf16 = [&](const void* s, void* d) {
    p.to_bf16(static_cast<const float*>(s), static_cast<uint16_t*>(d), n);
  };
  auto from_half = [&](const void* s, void* d) {
    p.from_half(static_cast<const uint16_t*>(s), static_cast<float*>(d), n);
  };
  auto from_bf16 = [&](const void* s, void* d) {
    p.from_bf16(static_cast<const uint16_t*>(s), static_cast<float*>(d), n);
  };
  auto half_of = [&](size_t i) { return FloatToHalfBits(in_f[i]); };
  auto bf16_of = [&](size_t i) { return FloatToBf16Bits(in_f[i]); };
  auto float_of_half = [&](size_t i) { return HalfBitsToFloat(in_h[i]); };
  auto float_of_bf16 = [&](size_t i) { return Bf16BitsToFloat(in_h[i]); };
  run(in_f.data(), 4, 2, half_of, to_half);
  run(in_f.data(), 4, 2, bf16_of, to_bf16);
  run(in_h.data(), 2, 4, float_of_half, from_half);
  run(in_h.data(), 2, 4, float_of_bf16, from_bf16);
}

TEST_P(ConvertTest, OddLengthsAndElementOffsets) {
  const std::vector<float> pool = HardFloats();
  for (size_t n : {0, 1, 7, 15, 16, 17, 31, 33, 1000003}) {
    for (size_t off = 0; off <= 3; ++off) {
      // Whole-element offsets keep each buffer aligned to its element size.
      CheckAtByteOffsets(GetParam(), pool, n, off * 4, off * 2);
      CheckAtByteOffsets(GetParam(), pool, n, off * 2, off * 4);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_P(ConvertTest, OddByteAddresses) {
  const std::vector<float> pool = HardFloats();
  for (size_t n : {0, 1, 7, 15, 16, 17, 31, 33, 1003}) {
    for (auto [src_off, dst_off] : {std::pair{1, 3}, {3, 1}, {1, 0}, {0, 1}, {5, 7}}) {
      CheckAtByteOffsets(GetParam(), pool, n, src_off, dst_off);
      if (HasFatalFailure()) return;
    }
  }
}

#if defined(__x86_64__)
// Callers (or libraries they link) may run with FTZ/DAZ or a directed
// rounding mode; conversions must not change.
TEST_P(ConvertTest, ResultsIgnoreMxcsr) {
  const std::vector<float> src = HardFloats();
  std::vector<uint16_t> src_low(1 << 16);
  for (size_t i = 0; i < src_low.size(); ++i) src_low[i] = static_cast<uint16_t>(i);
  std::vector<uint16_t> half(src.size()), bf16(src.size());
  std::vector<float> from_half(src_low.size()), from_bf16(src_low.size());
  const unsigned int saved = _mm_getcsr();
  // FTZ (bit 15), DAZ (bit 6), round toward zero (bits 13-14).
  _mm_setcsr(saved | 0x8000u | 0x0040u | 0x6000u);
  GetParam().to_half(src.data(), half.data(), src.size());
  GetParam().to_bf16(src.data(), bf16.data(), src.size());
  GetParam().from_half(src_low.data(), from_half.data(), src_low.size());
  GetParam().from_bf16(src_low.data(), from_bf16.data(), src_low.size());
  _mm_setcsr(saved);
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(half[i], FloatToHalfBits(src[i])) << i;
    ASSERT_EQ(bf16[i], FloatToBf16Bits(src[i])) << i;
  }
  for (size_t i = 0; i < src_low.size(); ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    ASSERT_EQ(std::bit_cast<uint32_t>(from_half[i]), std::bit_cast<uint32_t>(HalfBitsToFloat(h)))
        << std::hex << h;
    ASSERT_EQ(std::bit_cast<uint32_t>(from_bf16[i]), std::bit_cast<uint32_t>(Bf16BitsToFloat(h)))
        << std::hex << h;
  }
}
#endif

INSTANTIATE_TEST_SUITE_P(AllPaths, ConvertTest, ::testing::ValuesIn(AllPaths()),
                         [](const ::testing::TestParamInfo<Path>& info) {
                           return info.param.name;
                         });

TEST(ConvertDispatchTest, ActiveLevelIsSupported) {
  EXPECT_TRUE(SimdLevelSupported(ActiveSimdLevel()));
}

}  // namespace
}  // namespace zo
