#include "offload/cpu_optimizer.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/fp16.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/aligned_buffer.h"

namespace zo {
namespace {

// Odd sizes on purpose: pieces then start inside chunks at odd global offsets
// and chunks end off line boundaries.
const std::vector<size_t> kOddChunkSizes = {1, 17, 1000, 0, 4099, 31, 20011};

// Owns the arrays of a set of chunks, filled deterministically.
class TestState {
 public:
  TestState(const std::vector<size_t>& sizes, DType grad_dtype, bool with_copy, DType copy_dtype,
            uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t n : sizes) {
      Arrays& a = arrays_.emplace_back();
      a.p.resize(n);
      a.m.resize(n);
      a.v.resize(n);
      a.grad.resize(n * DTypeSize(grad_dtype));
      a.copy.resize(with_copy ? n * DTypeSize(copy_dtype) : 0);
      for (size_t i = 0; i < n; ++i) {
        a.p[i] = normal(rng);
        a.m[i] = 0.1f * normal(rng);
        a.v[i] = 0.01f * std::abs(normal(rng));
        const float g = 0.05f * normal(rng);
        SetGrad(a.grad.data(), grad_dtype, i, g);
      }
    }
    for (Arrays& a : arrays_) {
      chunks_.push_back({a.p.data(), a.m.data(), a.v.data(),
                         TypedConstPtr{a.grad.data(), grad_dtype},
                         TypedPtr{with_copy ? a.copy.data() : nullptr, copy_dtype}, a.p.size()});
    }
  }

  static void SetGrad(void* base, DType dtype, size_t i, float g) {
    switch (dtype) {
      case DType::kFloat32:
        static_cast<float*>(base)[i] = g;
        break;
      case DType::kFloat16:
        static_cast<uint16_t*>(base)[i] = FloatToHalfBits(g);
        break;
      case DType::kBFloat16:
        static_cast<uint16_t*>(base)[i] = FloatToBf16Bits(g);
        break;
    }
  }

  const std::vector<OptimizerChunk>& chunks() const { return chunks_; }
  void SetGradAt(size_t chunk, size_t i, float g) {
    SetGrad(arrays_[chunk].grad.data(), chunks_[chunk].grad.dtype, i, g);
  }

  // Bitwise equality of every array.
  friend bool operator==(const TestState& a, const TestState& b) {
    if (a.arrays_.size() != b.arrays_.size()) return false;
    for (size_t c = 0; c < a.arrays_.size(); ++c) {
      const Arrays& x = a.arrays_[c];
      const Arrays& y = b.arrays_[c];
      auto same = [](const auto& u, const auto& w) {
        return u.size() == w.size() &&
               (u.empty() || std::memcmp(u.data(), w.data(), u.size() * sizeof(u[0])) == 0);
      };
      if (!same(x.p, y.p) || !same(x.m, y.m) || !same(x.v, y.v) || !same(x.copy, y.copy)) {
        return false;
      }
    }
    return true;
  }

 private:
  struct Arrays {
    std::vector<float> p, m, v;
    std::vector<uint8_t> grad, copy;
  };
  std::vector<Arrays> arrays_;
  std::vector<OptimizerChunk> chunks_;
};

enum class Algo { kAdam, kAdamL2, kAdagrad, kLion };

struct StepCase {
  Algo algo;
  DType grad_dtype;
  bool with_copy;
  DType copy_dtype;
};

std::string Describe(const StepCase& c) {
  const char* algo[] = {"AdamW", "AdamL2", "Adagrad", "Lion"};
  return std::string(algo[static_cast<int>(c.algo)]) + "_grad_" +
         std::string(DTypeName(c.grad_dtype)) + "_copy_" +
         (c.with_copy ? std::string(DTypeName(c.copy_dtype)) : "none");
}

std::string CaseName(const ::testing::TestParamInfo<StepCase>& info) {
  return Describe(info.param);
}

// ctest lists the case, not the struct's raw bytes.
void PrintTo(const StepCase& c, std::ostream* os) { *os << Describe(c); }

AdamStepConstants AdamConstants(bool adam_w, int64_t step) {
  AdamHyperParams hp;
  hp.lr = 1e-2;
  hp.weight_decay = 0.01;
  hp.adam_w_mode = adam_w;
  return MakeAdamStepConstants(hp, step, 0.5);
}
const AdagradStepConstants kAdagrad = {0.5f, 1e-2f, 1e-10f, 0.01f};
const LionStepConstants kLion = {0.5f, 1e-3f, 0.9f, 0.99f, 1.0f - 1e-5f};

void StepEngine(Algo algo, CpuOptimizer& opt, int64_t step, SimdLevel level) {
  switch (algo) {
    case Algo::kAdam:
      return opt.AdamStep(AdamConstants(true, step), level);
    case Algo::kAdamL2:
      return opt.AdamStep(AdamConstants(false, step), level);
    case Algo::kAdagrad:
      return opt.AdagradStep(kAdagrad, level);
    case Algo::kLion:
      return opt.LionStep(kLion, level);
  }
}

// The reference: the plain kernel over each whole chunk, on this thread.
void StepPlain(Algo algo, const std::vector<OptimizerChunk>& chunks, int64_t step,
               SimdLevel level) {
  for (const OptimizerChunk& c : chunks) {
    switch (algo) {
      case Algo::kAdam:
      case Algo::kAdamL2:
        AdamUpdate(AdamConstants(algo == Algo::kAdam, step), c.grad, c.p, c.m, c.v, c.low_precision,
                   c.n, level);
        break;
      case Algo::kAdagrad:
        AdagradUpdate(kAdagrad, c.grad, c.p, c.m, c.low_precision, c.n, level);
        break;
      case Algo::kLion:
        LionUpdate(kLion, c.grad, c.p, c.m, c.low_precision, c.n, level);
        break;
    }
  }
}

class CpuOptimizerStepTest : public ::testing::TestWithParam<StepCase> {};

TEST_P(CpuOptimizerStepTest, ThreadedStepIsBitIdenticalToSingleThreaded) {
  const StepCase& tc = GetParam();
  for (SimdLevel level : kAllSimdLevels) {
    if (!SimdLevelSupported(level)) continue;
    TestState plain(kOddChunkSizes, tc.grad_dtype, tc.with_copy, tc.copy_dtype, 7);
    TestState single(kOddChunkSizes, tc.grad_dtype, tc.with_copy, tc.copy_dtype, 7);
    ThreadPool one(1);
    CpuOptimizer single_opt(&one, single.chunks());
    for (int64_t step = 1; step <= 3; ++step) {
      StepPlain(tc.algo, plain.chunks(), step, level);
      StepEngine(tc.algo, single_opt, step, level);
    }
    ASSERT_TRUE(single == plain) << SimdLevelName(level);
    for (int workers : {2, 3, 4}) {
      SCOPED_TRACE(::testing::Message() << SimdLevelName(level) << " workers=" << workers);
      TestState threaded(kOddChunkSizes, tc.grad_dtype, tc.with_copy, tc.copy_dtype, 7);
      ThreadPool pool(workers);
      CpuOptimizer opt(&pool, threaded.chunks());
      for (int64_t step = 1; step <= 3; ++step) StepEngine(tc.algo, opt, step, level);
      EXPECT_TRUE(threaded == plain);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CpuOptimizerStepTest,
    ::testing::Values(StepCase{Algo::kAdam, DType::kFloat32, true, DType::kFloat16},
                      StepCase{Algo::kAdam, DType::kFloat16, true, DType::kFloat16},
                      StepCase{Algo::kAdam, DType::kBFloat16, true, DType::kBFloat16},
                      StepCase{Algo::kAdam, DType::kFloat16, false, DType::kFloat16},
                      StepCase{Algo::kAdamL2, DType::kFloat32, true, DType::kBFloat16},
                      StepCase{Algo::kAdagrad, DType::kFloat16, true, DType::kFloat16},
                      StepCase{Algo::kLion, DType::kBFloat16, true, DType::kBFloat16}),
    CaseName);

TEST(CpuOptimizerTest, StatsAreBitIdenticalAcrossWorkerCountsAndMatchDouble) {
  // Several stats blocks per chunk, ragged last blocks, an empty chunk.
  const std::vector<size_t> sizes = {3 * kStatsBlockElems + 5, 70001, 0, 3, kStatsBlockElems};
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    TestState state(sizes, dtype, false, DType::kFloat16, 11);
    // Reference: every gradient value as stored, squared and summed in double.
    std::vector<double> reference(sizes.size(), 0.0);
    for (size_t c = 0; c < sizes.size(); ++c) {
      const OptimizerChunk& chunk = state.chunks()[c];
      for (size_t i = 0; i < chunk.n; ++i) {
        double g = 0;
        switch (dtype) {
          case DType::kFloat32:
            g = static_cast<const float*>(chunk.grad.data)[i];
            break;
          case DType::kFloat16:
            g = HalfBitsToFloat(static_cast<const uint16_t*>(chunk.grad.data)[i]);
            break;
          case DType::kBFloat16:
            g = Bf16BitsToFloat(static_cast<const uint16_t*>(chunk.grad.data)[i]);
            break;
        }
        reference[c] += g * g;
      }
    }
    double reference_total = 0;
    for (double r : reference) reference_total += r;

    for (SimdLevel level : kAllSimdLevels) {
      if (!SimdLevelSupported(level)) continue;
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " " << SimdLevelName(level));
      ThreadPool one(1);
      const StepGradStats base = CpuOptimizer(&one, state.chunks()).ComputeGradStats(level);
      ASSERT_EQ(base.per_chunk.size(), sizes.size());
      EXPECT_FALSE(base.total.non_finite);
      EXPECT_NEAR(base.total.sum_squares, reference_total, 1e-9 * reference_total);
      for (size_t c = 0; c < sizes.size(); ++c) {
        EXPECT_NEAR(base.per_chunk[c].sum_squares, reference[c], 1e-9 * reference[c] + 1e-30);
      }
      for (int workers : {2, 3, 4, 7}) {
        ThreadPool pool(workers);
        const StepGradStats s = CpuOptimizer(&pool, state.chunks()).ComputeGradStats(level);
        EXPECT_EQ(std::memcmp(&s.total.sum_squares, &base.total.sum_squares, sizeof(double)), 0)
            << workers << " workers: " << s.total.sum_squares << " vs " << base.total.sum_squares;
        for (size_t c = 0; c < sizes.size(); ++c) {
          EXPECT_EQ(s.per_chunk[c].sum_squares, base.per_chunk[c].sum_squares);
        }
      }
    }
  }
}

// Chunks' statistics taken one set at a time (as a speculative update takes
// them when each chunk fills) and the rest read later give the bits of one
// whole pass.
TEST(CpuOptimizerTest, StatsOfSomeChunksFirstAndTheRestLaterAreTheWholePass) {
  TestState state({100, 2 * kStatsBlockElems + 5, 50, 3 * kStatsBlockElems}, DType::kFloat32, false,
                  DType::kFloat16, 3);
  state.SetGradAt(2, 7, std::numeric_limits<float>::infinity());
  ThreadPool pool(3);
  const CpuOptimizer opt(&pool, state.chunks());
  const StepGradStats whole = opt.ComputeGradStats();
  const std::vector<GradStats> first = opt.ComputeChunkGradStats({3, 1});
  ASSERT_EQ(first.size(), 2u);
  // On one worker (beside the pushes) the same bits.
  const std::vector<GradStats> alone = opt.ComputeChunkGradStats({3, 1}, /*max_workers=*/1);
  ASSERT_EQ(alone.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(std::memcmp(&alone[i].sum_squares, &first[i].sum_squares, sizeof(double)), 0);
    EXPECT_EQ(alone[i].non_finite, first[i].non_finite);
  }
  std::vector<std::optional<GradStats>> known(4);
  known[3] = first[0];
  known[1] = first[1];
  const StepGradStats rest = opt.ComputeGradStats(known);
  EXPECT_EQ(std::memcmp(&rest.total.sum_squares, &whole.total.sum_squares, sizeof(double)), 0);
  EXPECT_TRUE(rest.total.non_finite);
  for (size_t c = 0; c < 4; ++c) {
    EXPECT_EQ(std::memcmp(&rest.per_chunk[c].sum_squares, &whole.per_chunk[c].sum_squares,
                          sizeof(double)),
              0)
        << "chunk " << c;
    EXPECT_EQ(rest.per_chunk[c].non_finite, whole.per_chunk[c].non_finite) << "chunk " << c;
  }
  // A known entry is used as given, not read again.
  known[0] = GradStats{.sum_squares = 1e6, .non_finite = false};
  EXPECT_EQ(opt.ComputeGradStats(known).per_chunk[0].sum_squares, 1e6);
}

TEST(CpuOptimizerTest, StatsFlagTheChunkWithANonFiniteValue) {
  TestState state({100, 2 * kStatsBlockElems, 50}, DType::kFloat32, false, DType::kFloat16, 3);
  state.SetGradAt(1, kStatsBlockElems + 17, std::numeric_limits<float>::infinity());
  ThreadPool pool(3);
  const StepGradStats s = CpuOptimizer(&pool, state.chunks()).ComputeGradStats();
  EXPECT_TRUE(s.total.non_finite);
  EXPECT_FALSE(s.per_chunk[0].non_finite);
  EXPECT_TRUE(s.per_chunk[1].non_finite);
  EXPECT_FALSE(s.per_chunk[2].non_finite);
}

TEST(CpuOptimizerTest, FirstTouchZeroesEveryArrayOfAlignedBuffers) {
  constexpr size_t kN = 100003;
  auto buf = AlignedBuffer::Allocate(kN * (3 * sizeof(float) + 2 + 2) + 4 * kPageBytes);
  ASSERT_THAT(buf, testing::IsOk());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->data()) % kPageBytes, 0u);
  char* base = buf->as<char>();
  std::memset(base, 0x5a, buf->size());
  // Two chunks carved out of one arena, each array starting on a cache line.
  std::vector<OptimizerChunk> chunks;
  size_t offset = 0;
  auto take = [&](size_t bytes) {
    void* p = base + offset;
    offset += RoundUpTo(bytes, kCacheLineBytes);
    return p;
  };
  for (size_t n : {kN / 2, kN - kN / 2}) {
    OptimizerChunk c;
    c.n = n;
    c.p = static_cast<float*>(take(n * 4));
    c.m = static_cast<float*>(take(n * 4));
    c.v = static_cast<float*>(take(n * 4));
    c.grad = {take(n * 2), DType::kFloat16};
    c.low_precision = {take(n * 2), DType::kBFloat16};
    chunks.push_back(c);
  }
  ThreadPool pool(3);
  CpuOptimizer opt(&pool, chunks);
  opt.FirstTouchZero();
  for (const OptimizerChunk& c : chunks) {
    for (size_t i = 0; i < c.n; ++i) {
      ASSERT_EQ(c.p[i], 0.0f);
      ASSERT_EQ(c.m[i], 0.0f);
      ASSERT_EQ(c.v[i], 0.0f);
      ASSERT_EQ(static_cast<const uint16_t*>(c.grad.data)[i], 0);
      ASSERT_EQ(static_cast<const uint16_t*>(c.low_precision.data)[i], 0);
    }
  }
  // Padding between arrays is not part of any chunk and is left alone.
  EXPECT_EQ(static_cast<unsigned char>(base[offset]), 0x5a);
}

TEST(AlignedBufferTest, EmptyAndMoved) {
  auto empty = AlignedBuffer::Allocate(0);
  ASSERT_THAT(empty, testing::IsOk());
  EXPECT_EQ(empty->data(), nullptr);
  auto buf = AlignedBuffer::Allocate(100);
  ASSERT_THAT(buf, testing::IsOk());
  AlignedBuffer moved = std::move(*buf);
  EXPECT_NE(moved.data(), nullptr);
  EXPECT_EQ(moved.size(), 100u);
  EXPECT_EQ(buf->data(), nullptr);
}

TEST(AlignedBufferTest, ImpossibleSizeIsResourceExhausted) {
  EXPECT_THAT(
      AlignedBuffer::Allocate(size_t{1} << 62),
      testing::StatusIs(absl::StatusCode::kResourceExhausted, ::testing::HasSubstr("mmap")));
}

}  // namespace
}  // namespace zo
