#include "offload/tier/tiered_state.h"

#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/fp16.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/io/direct_file.h"
#include "offload/io/fault_injecting_backend.h"
#include "offload/io/io_test_util.h"
#include "offload/tier/swap_file.h"
#include "offload/tier/swap_layout.h"
#include "offload/tier/tier_test_util.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::ExpectSameBits;
using ::zo::testing::FirstDifference;
using ::zo::testing::IsOk;
using ::zo::testing::Pattern;
using ::zo::testing::RunSteps;
using ::zo::testing::ScopedTempDir;
using ::zo::testing::Snapshot;
using ::zo::testing::StateSnapshot;
using ::zo::testing::StatusIs;

constexpr int kSteps = 30;

struct TierCase {
  std::string name;
  int64_t total_elems;
  int64_t sub_group_elems;
  int64_t ram_sub_groups;  // budget in whole sub-groups
  int buffer_count = 3;
  int workers = 2;
  IoEngineKind engine = IoEngineKind::kAuto;
  size_t block_size = size_t{1} << 20;
  int queue_depth = 8;
  bool checksums = true;
  bool jumbled_engine = false;  // completions delayed and shuffled

  // ctest lists the name, not the raw bytes (heap pointers) of the struct.
  friend void PrintTo(const TierCase& c, std::ostream* os) { *os << c.name; }
};

class TieredStateBitIdentityTest : public ::testing::TestWithParam<TierCase> {};

// The same 30 steps with the state on NVMe (wholly or partly) and wholly in
// RAM give the same bits: master, m, v and the fp16 copy.
TEST_P(TieredStateBitIdentityTest, NvmeMatchesRam) {
  const TierCase& tc = GetParam();
  ScopedTempDir dir;
  if (absl::Status direct = CheckDirectIo(dir.path()); !direct.ok()) {
    GTEST_SKIP() << "O_DIRECT unsupported under " << dir.path() << ": " << direct;
  }
  const std::vector<float> initial = Pattern(tc.total_elems, 7);

  ThreadPool ram_pool(3);
  TieredStateOptions ram_options;
  ram_options.sub_group_elems = tc.sub_group_elems;
  ZO_ASSERT_OK_AND_ASSIGN(auto ram,
                          TieredOptimizerState::Create(ram_options, tc.total_elems, &ram_pool));
  ASSERT_EQ(ram->nvme_sub_groups(), 0);
  ASSERT_THAT(ram->LoadMaster(0, initial), IsOk());

  ThreadPool pool(tc.workers);
  TieredStateOptions options;
  options.swap_dir = dir.File("job");
  options.sub_group_elems = tc.sub_group_elems;
  options.ram_budget_bytes = tc.ram_sub_groups * tc.sub_group_elems * 12;
  options.buffer_count = tc.buffer_count;
  options.checksums = tc.checksums;
  options.io.kind = tc.engine;
  options.io.block_size = tc.block_size;
  options.io.queue_depth = tc.queue_depth;
  TieredStateSeams seams;
  if (tc.jumbled_engine) {
    seams.make_engine = [](const IoEngineOptions& o) -> absl::StatusOr<std::unique_ptr<IoEngine>> {
      ZO_ASSIGN_OR_RETURN(auto inner, CreateIoBackend(o));
      FaultPlan plan;
      plan.reorder = true;
      IoFault delay;
      delay.action = IoFault::Action::kDelay;
      delay.delay = 2;
      delay.probability = 0.3;
      plan.faults.push_back(delay);
      return CreateFaultInjectingEngine(o, std::move(inner), std::move(plan));
    };
  }
  ZO_ASSERT_OK_AND_ASSIGN(
      auto nvme, TieredOptimizerState::Create(options, tc.total_elems, &pool, std::move(seams)));
  const SwapLayout layout(tc.total_elems, tc.sub_group_elems, options.ram_budget_bytes);
  ASSERT_EQ(nvme->ram_sub_groups(), tc.ram_sub_groups);
  ASSERT_GT(nvme->nvme_sub_groups(), 0);
  ASSERT_EQ(nvme->swap_path(), options.swap_dir + "/" + kSwapFileName);
  struct stat st {};
  ASSERT_EQ(stat(nvme->swap_path().c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), layout.file_bytes());
  ASSERT_THAT(nvme->LoadMaster(0, initial), IsOk());

  std::vector<uint16_t> ram_fp16, nvme_fp16;
  ASSERT_THAT(RunSteps(*ram, 1, kSteps, &ram_fp16), IsOk());
  ASSERT_THAT(RunSteps(*nvme, 1, kSteps, &nvme_fp16), IsOk());
  EXPECT_EQ(FirstDifference(ram_fp16, nvme_fp16), "") << "fp16 copy";

  StateSnapshot want, got;
  ASSERT_THAT(Snapshot(*ram, &want), IsOk());
  ASSERT_THAT(Snapshot(*nvme, &got), IsOk());
  ExpectSameBits(want, got);
  EXPECT_NE(FirstDifference(want.master, initial), "") << "the steps changed nothing";

  // The bare I/O pass leaves every bit where it was.
  ASSERT_THAT(nvme->IoOnlyPass(), IsOk());
  ASSERT_THAT(Snapshot(*nvme, &got), IsOk());
  ExpectSameBits(want, got);
  ASSERT_THAT(nvme->health(), IsOk());

  const std::string path = nvme->swap_path();
  nvme.reset();
  EXPECT_FALSE(std::filesystem::exists(path)) << "swap file left behind";
  EXPECT_FALSE(std::filesystem::exists(options.swap_dir)) << "swap directory left behind";
}

INSTANTIATE_TEST_SUITE_P(Layouts, TieredStateBitIdentityTest,
                         ::testing::Values(
                             // Odd total, sub-groups of 40'000 bytes (not a multiple of 4 KiB).
                             TierCase{.name = "AllOnNvme",
                                      .total_elems = 100'003,
                                      .sub_group_elems = 10'000,
                                      .ram_sub_groups = 0},
                             TierCase{.name = "OneInRamPread",
                                      .total_elems = 100'003,
                                      .sub_group_elems = 10'000,
                                      .ram_sub_groups = 1,
                                      .buffer_count = 4,
                                      .workers = 3,
                                      .engine = IoEngineKind::kPread},
                             // Several tiles per sub-group, a short last one, small pieces.
                             TierCase{.name = "MixedMultiTile",
                                      .total_elems = 250'001,
                                      .sub_group_elems = 40'000,
                                      .ram_sub_groups = 3,
                                      .block_size = 16 << 10,
                                      .queue_depth = 4},
                             TierCase{.name = "MoreBuffersThanSlots",
                                      .total_elems = 70'001,
                                      .sub_group_elems = 2 * kTileElems + 5,
                                      .ram_sub_groups = 0,
                                      .buffer_count = 8,
                                      .workers = 1},
                             TierCase{.name = "OneSubGroup",
                                      .total_elems = 1'001,
                                      .sub_group_elems = 1'000'000'000,
                                      .ram_sub_groups = 0},
                             TierCase{.name = "NoChecksums",
                                      .total_elems = 100'003,
                                      .sub_group_elems = 10'000,
                                      .ram_sub_groups = 2,
                                      .checksums = false},
                             TierCase{.name = "JumbledCompletions",
                                      .total_elems = 250'001,
                                      .sub_group_elems = 40'000,
                                      .ram_sub_groups = 1,
                                      .workers = 3,
                                      .block_size = 16 << 10,
                                      .jumbled_engine = true}),
                         [](const ::testing::TestParamInfo<TierCase>& info) {
                           return info.param.name;
                         });

class TieredStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (absl::Status direct = CheckDirectIo(dir_.path()); !direct.ok()) {
      GTEST_SKIP() << "O_DIRECT unsupported under " << dir_.path() << ": " << direct;
    }
  }
  TieredStateOptions Options(int64_t ram_sub_groups) const {
    TieredStateOptions options;
    options.swap_dir = dir_.File("job");
    options.sub_group_elems = kSubGroup;
    options.ram_budget_bytes = ram_sub_groups * kSubGroup * 12;
    return options;
  }

  static constexpr int64_t kTotal = 100'003;
  static constexpr int64_t kSubGroup = 10'000;
  ScopedTempDir dir_;
  ThreadPool pool_{2};
};

TEST_F(TieredStateTest, StartsAtZero) {
  ZO_ASSERT_OK_AND_ASSIGN(auto state, TieredOptimizerState::Create(Options(2), kTotal, &pool_));
  StateSnapshot got;
  ASSERT_THAT(Snapshot(*state, &got), IsOk());
  const std::vector<float> zeros(kTotal, 0.0f);
  EXPECT_EQ(FirstDifference(got.master, zeros), "");
  EXPECT_EQ(FirstDifference(got.m, zeros), "");
  EXPECT_EQ(FirstDifference(got.v, zeros), "");
}

// Writes and reads in pieces that straddle the RAM/NVMe boundary and
// sub-groups, read back in other pieces.
TEST_F(TieredStateTest, ReadWriteRoundTripAcrossTiers) {
  ZO_ASSERT_OK_AND_ASSIGN(auto state, TieredOptimizerState::Create(Options(2), kTotal, &pool_));
  ASSERT_EQ(state->ram_sub_groups(), 2);
  const std::vector<float> master = Pattern(kTotal, 1), m = Pattern(kTotal, 2),
                           v = Pattern(kTotal, 3, 0.5f);
  for (int64_t at = 0; at < kTotal; at += 7'777) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(7'777, kTotal - at));
    ASSERT_THAT(state->WriteState(at, absl::MakeConstSpan(master).subspan(at, n),
                                  absl::MakeConstSpan(m).subspan(at, n),
                                  absl::MakeConstSpan(v).subspan(at, n)),
                IsOk());
  }
  StateSnapshot got;
  got.master.assign(kTotal, 0.0f);
  got.m.assign(kTotal, 0.0f);
  got.v.assign(kTotal, 0.0f);
  for (int64_t at = 0; at < kTotal; at += 12'345) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(12'345, kTotal - at));
    ASSERT_THAT(state->ReadState(at, absl::MakeSpan(got.master).subspan(at, n),
                                 absl::MakeSpan(got.m).subspan(at, n),
                                 absl::MakeSpan(got.v).subspan(at, n)),
                IsOk());
  }
  ExpectSameBits({master, m, v}, got);

  // Only v, across the boundary between sub-groups 1 (RAM) and 2 (NVMe).
  std::vector<float> only_v(5'000);
  ASSERT_THAT(state->ReadState(17'500, {}, {}, absl::MakeSpan(only_v)), IsOk());
  EXPECT_EQ(FirstDifference(only_v, std::vector<float>(v.begin() + 17'500, v.begin() + 22'500)),
            "");

  // LoadMaster sets master and zeroes m and v in its range only.
  const std::vector<float> loaded = Pattern(30'000, 9);
  ASSERT_THAT(state->LoadMaster(15'000, loaded), IsOk());
  StateSnapshot after;
  ASSERT_THAT(Snapshot(*state, &after), IsOk());
  for (int64_t i = 0; i < kTotal; ++i) {
    const bool in = i >= 15'000 && i < 45'000;
    ASSERT_EQ(after.master[i], in ? loaded[i - 15'000] : master[i]) << i;
    ASSERT_EQ(after.m[i], in ? 0.0f : m[i]) << i;
    ASSERT_EQ(after.v[i], in ? 0.0f : v[i]) << i;
  }
}

TEST_F(TieredStateTest, RejectsBadArguments) {
  ZO_ASSERT_OK_AND_ASSIGN(auto state, TieredOptimizerState::Create(Options(0), kTotal, &pool_));
  std::vector<float> a(10), b(9);
  EXPECT_THAT(state->ReadState(kTotal - 5, absl::MakeSpan(a), {}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside")));
  EXPECT_THAT(state->LoadMaster(-1, a),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside")));
  EXPECT_THAT(state->ReadState(0, absl::MakeSpan(a), absl::MakeSpan(b), {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must match")));
  EXPECT_THAT(state->WriteState(0, a, a, b),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must match")));
  EXPECT_THAT(state->AdamStep(testing::TestStepConstants(1), {}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no gradient")));
  EXPECT_THAT(state->health(), IsOk());  // bad requests are not failures
}

TEST_F(TieredStateTest, RejectsBadOptions) {
  TieredStateOptions options = Options(0);
  options.buffer_count = 2;
  EXPECT_THAT(TieredOptimizerState::Create(options, kTotal, &pool_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("buffer_count")));
  options = Options(3);
  options.swap_dir.clear();
  EXPECT_THAT(TieredOptimizerState::Create(options, kTotal, &pool_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("swap_dir is empty")));
  options = Options(0);
  options.sub_group_elems = 0;
  EXPECT_THAT(TieredOptimizerState::Create(options, kTotal, &pool_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sub_group_elems")));
  EXPECT_THAT(TieredOptimizerState::Create(Options(0), kTotal, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pool")));
  // Everything fits: neither a directory nor three buffers are needed.
  options = Options(0);
  options.swap_dir.clear();
  options.ram_budget_bytes = kTotal * 12;
  options.buffer_count = 1;
  ZO_ASSERT_OK_AND_ASSIGN(auto state, TieredOptimizerState::Create(options, kTotal, &pool_));
  EXPECT_EQ(state->nvme_sub_groups(), 0);
  EXPECT_EQ(state->swap_path(), "");
}

TEST_F(TieredStateTest, OneStatePerDirectory) {
  ZO_ASSERT_OK_AND_ASSIGN(auto first, TieredOptimizerState::Create(Options(0), kTotal, &pool_));
  EXPECT_THAT(TieredOptimizerState::Create(Options(0), kTotal, &pool_),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("in use")));
  first.reset();
  EXPECT_THAT(TieredOptimizerState::Create(Options(0), kTotal, &pool_), IsOk());
}

TEST_F(TieredStateTest, EmptyState) {
  ZO_ASSERT_OK_AND_ASSIGN(auto state, TieredOptimizerState::Create(Options(0), 0, &pool_));
  EXPECT_EQ(state->num_sub_groups(), 0);
  EXPECT_THAT(state->AdamStep(testing::TestStepConstants(1), {}, {}), IsOk());
  EXPECT_THAT(state->IoOnlyPass(), IsOk());
}

}  // namespace
}  // namespace zo

namespace zo {
namespace {

// The progress hook reports the RAM sub-groups, then each NVMe sub-group in
// order; when it reports `end`, [0, end) has its low-precision copy and
// nothing after it has been touched yet.
TEST_F(TieredStateTest, ReportsEachUpdatedPrefixInOrder) {
  ZO_ASSERT_OK_AND_ASSIGN(auto state, TieredOptimizerState::Create(Options(2), kTotal, &pool_));
  ASSERT_THAT(state->LoadMaster(0, Pattern(kTotal, 4)), IsOk());
  const std::vector<float> grad = Pattern(kTotal, 5);
  constexpr uint16_t kUntouched = 0xFFFF;  // a NaN the update never writes
  std::vector<uint16_t> copy(kTotal, kUntouched);
  std::vector<int64_t> ends;
  std::string problem;
  const auto updated = [&](int64_t end) {
    ends.push_back(end);
    if (copy[end - 1] == kUntouched) problem += " [0, " + std::to_string(end) + ") not written;";
    if (end < kTotal && copy[end] != kUntouched)
      problem += " past " + std::to_string(end) + " written;";
  };
  ASSERT_THAT(state->AdamStep(MakeAdamStepConstants({}, 1, 1.0), {grad.data(), DType::kFloat32},
                              {copy.data(), DType::kFloat16}, updated),
              IsOk());
  std::vector<int64_t> want = {20'000};  // the two RAM sub-groups
  for (int64_t end = 30'000; end < kTotal; end += kSubGroup) want.push_back(end);
  want.push_back(kTotal);
  EXPECT_EQ(ends, want);
  EXPECT_EQ(problem, "");
}

// `tile_updated` shows every element once, after its update, with the
// master as it was before the step, rounded (what a delayed parameter update
// checks its undo against), and the state the step left; a pull may read a
// range from then on. RAM and NVMe tiles alike. It takes the kernel's one
// copy, so asking for a low-precision copy as well is refused.
TEST_F(TieredStateTest, ShowsEachTileOnceWithItsOldWeightsAndNewState) {
  ZO_ASSERT_OK_AND_ASSIGN(auto state, TieredOptimizerState::Create(Options(2), kTotal, &pool_));
  const std::vector<float> before = Pattern(kTotal, 4);
  ASSERT_THAT(state->LoadMaster(0, before), IsOk());
  const std::vector<float> grad = Pattern(kTotal, 5);
  // What each tile showed, by element (RAM and NVMe tiles alike).
  std::vector<uint16_t> old_copy(kTotal);
  std::vector<float> p(kTotal), m(kTotal), v(kTotal);
  std::vector<std::atomic<int>> told(kTotal);
  const auto tile_updated = [&](const TieredOptimizerState::UpdatedTile& t) {
    const auto* old_weights = static_cast<const uint16_t*>(t.old_weights);
    for (int64_t i = 0; i < t.n; ++i) {
      old_copy[t.offset + i] = old_weights[i];
      p[t.offset + i] = t.p[i];
      m[t.offset + i] = t.m[i];
      v[t.offset + i] = t.v[i];
      ++told[t.offset + i];
    }
  };
  ASSERT_THAT(
      state->AdamStep(MakeAdamStepConstants({}, 1, 1.0), {grad.data(), DType::kFloat32},
                      {nullptr, DType::kFloat16}, nullptr, nullptr, tile_updated, DType::kFloat16),
      IsOk());
  std::vector<float> after(kTotal), m_after(kTotal), v_after(kTotal);
  ASSERT_THAT(
      state->ReadState(0, absl::MakeSpan(after), absl::MakeSpan(m_after), absl::MakeSpan(v_after)),
      IsOk());
  int64_t wrong = 0, moved = 0, not_told_once = 0, not_the_state = 0;
  for (int64_t i = 0; i < kTotal; ++i) {
    if (old_copy[i] != FloatToHalfBits(before[i])) ++wrong;
    if (after[i] != before[i]) ++moved;
    if (told[i] != 1) ++not_told_once;
    if (p[i] != after[i] || m[i] != m_after[i] || v[i] != v_after[i]) ++not_the_state;
  }
  EXPECT_EQ(wrong, 0) << "old weights that are not the old master rounded";
  EXPECT_EQ(not_told_once, 0);
  EXPECT_EQ(not_the_state, 0) << "tiles shown with a state other than the step's result";
  EXPECT_GT(moved, kTotal / 2) << "the step did update the master";

  // Both a copy and old weights: refused, nothing changed.
  std::vector<uint16_t> copy(kTotal);
  EXPECT_THAT(state->AdamStep(MakeAdamStepConstants({}, 2, 1.0), {grad.data(), DType::kFloat32},
                              {copy.data(), DType::kFloat16}, nullptr, nullptr, tile_updated),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cannot both")));
  std::vector<float> unchanged(kTotal);
  ASSERT_THAT(state->ReadState(0, absl::MakeSpan(unchanged), {}, {}), IsOk());
  EXPECT_EQ(unchanged, after);
}

// Constants by range (parameter groups): every element, in RAM or on NVMe,
// in a tile alone or in one shared with other runs, gets the bits of a
// plain update with its run's constants; with tile_updated too.
TEST_F(TieredStateTest, RangedConstantsGiveEachRunTheBitsOfItsOwnStep) {
  AdamHyperParams a, b;
  a.lr = 1e-2;
  a.weight_decay = 0.1;
  b.lr = 3e-3;
  b.beta1 = 0.8;
  b.eps = 1e-6;
  const AdamStepConstants ka = MakeAdamStepConstants(a, 1, 0.5);
  const AdamStepConstants kb = MakeAdamStepConstants(b, 1, 0.5);
  // Runs inside a tile, across tiles, and across the RAM/NVMe boundary at 20'000.
  const RangedConstants<AdamStepConstants> c(
      {{0, ka}, {100, kb}, {117, ka}, {kTileElems + 5, kb}, {19'990, ka}, {20'010, kb}});
  const std::vector<float> before = Pattern(kTotal, 6);
  const std::vector<float> grad = Pattern(kTotal, 7);
  std::vector<float> want = before, want_m(kTotal, 0.0f), want_v(kTotal, 0.0f);
  c.ForEach(0, kTotal, [&](int64_t lo, int64_t hi, const AdamStepConstants& k) {
    AdamUpdate(k, {grad.data() + lo, DType::kFloat32}, want.data() + lo, want_m.data() + lo,
               want_v.data() + lo, {nullptr, DType::kFloat16}, static_cast<size_t>(hi - lo));
  });
  for (const bool with_tiles : {false, true}) {
    SCOPED_TRACE(with_tiles ? "tile_updated" : "plain");
    ZO_ASSERT_OK_AND_ASSIGN(auto state, TieredOptimizerState::Create(Options(2), kTotal, &pool_));
    ASSERT_THAT(state->LoadMaster(0, before), IsOk());
    std::vector<uint16_t> old_copy(kTotal);
    const auto tile_updated = [&](const TieredOptimizerState::UpdatedTile& t) {
      std::memcpy(old_copy.data() + t.offset, t.old_weights, static_cast<size_t>(t.n) * 2);
    };
    ASSERT_THAT(state->AdamStep(c, {grad.data(), DType::kFloat32}, {nullptr, DType::kFloat16},
                                nullptr, nullptr,
                                with_tiles ? TieredOptimizerState::TileUpdated(tile_updated)
                                           : TieredOptimizerState::TileUpdated()),
                IsOk());
    StateSnapshot got;
    ASSERT_THAT(Snapshot(*state, &got), IsOk());
    ExpectSameBits({want, want_m, want_v}, got);
    for (int64_t i = 0; with_tiles && i < kTotal; ++i) {
      ASSERT_EQ(old_copy[i], FloatToHalfBits(before[i])) << i;
    }
  }
}

// The swap's I/O totals count what a step moves: each NVMe sub-group read
// once and written once (its slot: master, m and v of its elements, padded).
TEST_F(TieredStateTest, CountsTheSwapIoOfAStep) {
  ZO_ASSERT_OK_AND_ASSIGN(auto state, TieredOptimizerState::Create(Options(2), kTotal, &pool_));
  ASSERT_THAT(state->LoadMaster(0, Pattern(kTotal, 4)), IsOk());
  const SwapIoStats loaded = state->swap_io_stats();
  const int64_t slots = state->nvme_sub_groups();
  ASSERT_EQ(slots, 9);
  EXPECT_EQ(loaded.writes, slots);  // LoadMaster writes every NVMe slot once
  const int64_t slot_bytes = loaded.write_bytes / slots;
  EXPECT_GE(slot_bytes, kSubGroup * 12);

  const std::vector<float> grad = Pattern(kTotal, 5);
  ASSERT_THAT(state->AdamStep(MakeAdamStepConstants({}, 1, 1.0), {grad.data(), DType::kFloat32},
                              {nullptr, DType::kFloat16}),
              IsOk());
  const SwapIoStats stepped = state->swap_io_stats();
  EXPECT_EQ(stepped.reads - loaded.reads, slots);
  EXPECT_EQ(stepped.writes - loaded.writes, slots);
  EXPECT_EQ(stepped.read_bytes - loaded.read_bytes, slots * slot_bytes);
  EXPECT_EQ(stepped.write_bytes - loaded.write_bytes, slots * slot_bytes);
  EXPECT_GT(stepped.read_seconds, loaded.read_seconds);
  EXPECT_GT(stepped.write_seconds, loaded.write_seconds);

  // Everything in RAM: no swap, no I/O.
  ZO_ASSERT_OK_AND_ASSIGN(auto ram, TieredOptimizerState::Create(Options(11), kTotal, &pool_));
  EXPECT_EQ(ram->swap_io_stats().reads + ram->swap_io_stats().writes, 0);
}

}  // namespace
}  // namespace zo
