// A speculative update (TieredOptimizerState::SpeculateAdam and the rest):
// whatever was speculated, committed or discarded, the state ends bit for
// bit where AdamStep with the decided constants leaves a twin, and the state
// reads as it was until the commit.
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "common/bf16.h"
#include "common/fp16.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/io/direct_file.h"
#include "offload/io/io_test_util.h"
#include "offload/tier/swap_layout.h"
#include "offload/tier/tier_test_util.h"
#include "offload/tier/tiered_state.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::ExpectSameBits;
using ::zo::testing::IsOk;
using ::zo::testing::Pattern;
using ::zo::testing::ScopedTempDir;
using ::zo::testing::Snapshot;
using ::zo::testing::StateSnapshot;
using ::zo::testing::StatusIs;

// Not a multiple of a tile, with sub-groups that are not either.
constexpr int64_t kTotal = 3 * kTileElems + 1234;
constexpr int64_t kSubGroup = kTileElems + 777;

// Two parameter groups, one run boundary inside a tile.
RangedConstants<AdamStepConstants> Constants(int64_t step, double lr_scale = 1.0) {
  AdamHyperParams a, b;
  a.lr = 1e-2 * lr_scale;
  a.weight_decay = 0.1;
  b.lr = 3e-3 * lr_scale;
  b.beta1 = 0.8;
  return RangedConstants<AdamStepConstants>(
      {{0, MakeAdamStepConstants(a, step, 0.5)},
       {kTileElems + 100, MakeAdamStepConstants(b, step, 0.5)}});
}

class TieredStateSpeculationTest : public ::testing::Test {
 protected:
  std::unique_ptr<TieredOptimizerState> NewState() {
    TieredStateOptions options;
    options.sub_group_elems = kSubGroup;
    absl::StatusOr<std::unique_ptr<TieredOptimizerState>> state =
        TieredOptimizerState::Create(options, kTotal, &pool_);
    EXPECT_THAT(state.status(), IsOk());
    EXPECT_THAT((*state)->LoadMaster(0, Pattern(kTotal, 3)), IsOk());
    return std::move(*state);
  }
  static StateSnapshot Read(TieredOptimizerState& state) {
    StateSnapshot s;
    EXPECT_THAT(Snapshot(state, &s), IsOk());
    return s;
  }

  ThreadPool pool_{2};
};

// Steps 1-3 on a twin with AdamStep; here step 1 is speculated in ranges
// that start and end off the tile grid (some parts never; on one worker or
// all), step 2 wholly, step 3 not at all; each is committed. Between the speculation and the
// commit the state reads as before the step.
TEST_F(TieredStateSpeculationTest, CommitLeavesWhatAdamStepLeaves) {
  auto twin = NewState();
  auto state = NewState();
  ASSERT_THAT(state->ReserveSpeculation(), IsOk());
  EXPECT_TRUE(state->speculation_reserved());
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges = {
      {{5, 900}, {kTileElems - 3, 2 * kTileElems + 11}, {kTotal - 40, kTotal}}, {{0, kTotal}}, {}};
  for (int step = 1; step <= 3; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    const std::vector<float> grad = Pattern(kTotal, 100 + static_cast<uint64_t>(step), 2.0f);
    const TypedConstPtr g{grad.data(), DType::kFloat32};
    ASSERT_THAT(twin->AdamStep(Constants(step), g, {}), IsOk());
    const StateSnapshot before = Read(*state);
    int64_t speculated = 0;
    // Every other range on all the pool's workers (the pushes all in).
    bool all_workers = false;
    for (const auto& [b, e] : ranges[static_cast<size_t>(step - 1)]) {
      ASSERT_THAT(
          state->SpeculateAdam(Constants(step), g, b, e - b, std::nullopt, nullptr, all_workers),
          IsOk());
      speculated += e - b;
      all_workers = !all_workers;
    }
    EXPECT_EQ(state->speculated_elems(), speculated);
    ExpectSameBits(Read(*state), before);
    // The checkpoint's hook sees the state before the step; the pulls' hook
    // the state after it, once it is the state.
    std::vector<float> seen_before(kTotal, -1.0f), seen_after(kTotal, -1.0f);
    ASSERT_THAT(state->CommitSpeculation(
                    Constants(step), g,
                    [&](int64_t offset, int64_t n, const float* p, const float*, const float*) {
                      std::memcpy(seen_before.data() + offset, p, static_cast<size_t>(n) * 4);
                    },
                    [&](const TieredOptimizerState::UpdatedTile& t) {
                      EXPECT_EQ(t.old_weights, nullptr);
                      std::memcpy(seen_after.data() + t.offset, t.p, static_cast<size_t>(t.n) * 4);
                    }),
                IsOk());
    EXPECT_EQ(state->speculated_elems(), 0);
    const StateSnapshot after = Read(*state);
    ExpectSameBits(after, Read(*twin));
    EXPECT_EQ(::zo::testing::FirstDifference(seen_before, before.master), "");
    EXPECT_EQ(::zo::testing::FirstDifference(seen_after, after.master), "");
  }
}

// With a low-precision dtype each speculated piece is shown rounded, once,
// in the bits the step's own copy gets: the committed master, rounded.
TEST_F(TieredStateSpeculationTest, RoundedTilesAreTheCommittedWeightsRounded) {
  for (const DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    auto state = NewState();
    ASSERT_THAT(state->ReserveSpeculation(), IsOk());
    const std::vector<float> grad = Pattern(kTotal, 7, 2.0f);
    const TypedConstPtr g{grad.data(), DType::kFloat32};
    std::vector<uint16_t> rounded(kTotal, 0xffff);
    std::vector<int> shown(kTotal, 0);
    std::mutex mu;  // pieces come from the pool's workers
    const auto take = [&](const TieredOptimizerState::RoundedTile& t) {
      std::lock_guard lock(mu);
      std::memcpy(rounded.data() + t.offset, t.weights, static_cast<size_t>(t.n) * 2);
      for (int64_t i = t.offset; i < t.offset + t.n; ++i) ++shown[static_cast<size_t>(i)];
    };
    const std::vector<std::pair<int64_t, int64_t>> ranges = {{5, 900},
                                                             {kTileElems - 3, 2 * kTileElems + 11}};
    for (const auto& [b, e] : ranges) {
      ASSERT_THAT(state->SpeculateAdam(Constants(1), g, b, e - b, dtype, take), IsOk());
    }
    ASSERT_THAT(state->CommitSpeculation(Constants(1), g), IsOk());
    const StateSnapshot after = Read(*state);
    for (int64_t i = 0; i < kTotal; ++i) {
      const bool speculated =
          (i >= 5 && i < 900) || (i >= kTileElems - 3 && i < 2 * kTileElems + 11);
      const float w = after.master[static_cast<size_t>(i)];
      const uint16_t want = !speculated                 ? 0xffff
                            : dtype == DType::kBFloat16 ? FloatToBf16Bits(w)
                                                        : FloatToHalfBits(w);
      ASSERT_EQ(shown[static_cast<size_t>(i)], speculated ? 1 : 0) << "element " << i;
      ASSERT_EQ(rounded[static_cast<size_t>(i)], want) << "element " << i;
    }
  }
}

// A step speculated with constants the decision did not keep (a clip
// coefficient, or a skip): discarded, the state is as it was, and the step
// taken again with the decided constants, by AdamStep or by a second
// speculation, gives the twin's bits.
TEST_F(TieredStateSpeculationTest, DiscardLeavesTheStateAsItWas) {
  auto twin = NewState();
  auto state = NewState();
  ASSERT_THAT(state->ReserveSpeculation(), IsOk());
  for (int step = 1; step <= 2; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    const std::vector<float> grad = Pattern(kTotal, 200 + static_cast<uint64_t>(step), 2.0f);
    const TypedConstPtr g{grad.data(), DType::kFloat32};
    ASSERT_THAT(twin->AdamStep(Constants(step, 0.25), g, {}), IsOk());
    const StateSnapshot before = Read(*state);
    ASSERT_THAT(state->SpeculateAdam(Constants(step), g, 0, kTotal / 2), IsOk());
    state->DiscardSpeculation();
    EXPECT_EQ(state->speculated_elems(), 0);
    ExpectSameBits(Read(*state), before);
    if (step == 1) {
      ASSERT_THAT(state->AdamStep(Constants(step, 0.25), g, {}), IsOk());
    } else {
      ASSERT_THAT(state->SpeculateAdam(Constants(step, 0.25), g, 17, 5000), IsOk());
      ASSERT_THAT(state->CommitSpeculation(Constants(step, 0.25), g), IsOk());
    }
    ExpectSameBits(Read(*state), Read(*twin));
  }
}

// A restore during a speculation replaces what it was computed from: the
// speculation is gone, and a commit computes every element from the
// restored state.
TEST_F(TieredStateSpeculationTest, WritingTheStateForgetsTheSpeculation) {
  auto twin = NewState();
  auto state = NewState();
  ASSERT_THAT(state->ReserveSpeculation(), IsOk());
  const std::vector<float> grad = Pattern(kTotal, 300, 2.0f);
  const TypedConstPtr g{grad.data(), DType::kFloat32};
  ASSERT_THAT(state->SpeculateAdam(Constants(1), g, 0, kTotal), IsOk());
  const std::vector<float> restored = Pattern(kTotal, 9);
  ASSERT_THAT(state->WriteState(0, restored, Pattern(kTotal, 10, 0.1f), Pattern(kTotal, 11, 0.0f)),
              IsOk());
  ASSERT_THAT(twin->WriteState(0, restored, Pattern(kTotal, 10, 0.1f), Pattern(kTotal, 11, 0.0f)),
              IsOk());
  EXPECT_EQ(state->speculated_elems(), 0);
  ASSERT_THAT(state->CommitSpeculation(Constants(1), g), IsOk());
  ASSERT_THAT(twin->AdamStep(Constants(1), g, {}), IsOk());
  ExpectSameBits(Read(*state), Read(*twin));
}

TEST_F(TieredStateSpeculationTest, TheBankCountsInRamAndIsNeeded) {
  auto state = NewState();
  const int64_t without = state->ram_bytes();
  const std::vector<float> grad(kTotal, 1.0f);
  EXPECT_THAT(state->SpeculateAdam(Constants(1), {grad.data(), DType::kFloat32}, 0, 10),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("ReserveSpeculation")));
  ASSERT_THAT(state->ReserveSpeculation(), IsOk());
  EXPECT_EQ(state->ram_bytes(), without + kTotal * 12);
  ASSERT_THAT(state->ReserveSpeculation(), IsOk());  // once
  EXPECT_EQ(state->ram_bytes(), without + kTotal * 12);
  EXPECT_THAT(state->SpeculateAdam(Constants(1), {grad.data(), DType::kFloat32}, kTotal - 5, 10),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside")));
  EXPECT_EQ(state->speculated_elems(), 0);
}

TEST(TieredStateSpeculationNvmeTest, RefusedWithSubGroupsOnNvme) {
  ScopedTempDir dir;
  if (absl::Status direct = CheckDirectIo(dir.path()); !direct.ok()) {
    GTEST_SKIP() << "O_DIRECT unsupported under " << dir.path() << ": " << direct;
  }
  ThreadPool pool(2);
  TieredStateOptions options;
  options.swap_dir = dir.File("job");
  options.sub_group_elems = kSubGroup;
  options.ram_budget_bytes = kSubGroup * 12;
  ZO_ASSERT_OK_AND_ASSIGN(auto state, TieredOptimizerState::Create(options, kTotal, &pool));
  ASSERT_GT(state->nvme_sub_groups(), 0);
  EXPECT_THAT(state->ReserveSpeculation(),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("sub-groups lie on NVMe")));
  EXPECT_FALSE(state->speculation_reserved());
}

}  // namespace
}  // namespace zo
