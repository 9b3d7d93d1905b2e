// Failures of the NVMe tier: injected I/O faults, a truncated and a corrupted
// swap file, a full disk at Create. Each must fail with the sub-group and the
// offset in the message, leave the state "needs restore" (sticky), and a
// rewrite of every element must bring it back.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/io/direct_file.h"
#include "offload/io/fault_injecting_backend.h"
#include "offload/io/io_error.h"
#include "offload/io/io_test_util.h"
#include "offload/io/memory_backend.h"
#include "offload/tier/swap_file.h"
#include "offload/tier/swap_layout.h"
#include "offload/tier/tier_test_util.h"
#include "offload/tier/tiered_state.h"

namespace zo {
namespace {

using ::testing::AllOf;
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

// Sub-groups of 10'000 (40'000 bytes: padded to 40'960); sub-group 0 in RAM,
// 1..5 in swap slots 0..4, the last one 3 elements long.
constexpr int64_t kTotal = 50'003;
constexpr int64_t kSubGroup = 10'000;
constexpr int64_t kRamSubGroups = 1;

class TieredStateFaultTest : public ::testing::Test {
 protected:
  TieredStateFaultTest() : layout_(kTotal, kSubGroup, kRamSubGroups * kSubGroup * 12) {}

  void SetUp() override {
    if (absl::Status direct = CheckDirectIo(dir_.path()); !direct.ok()) {
      GTEST_SKIP() << "O_DIRECT unsupported under " << dir_.path() << ": " << direct;
    }
  }

  TieredStateOptions Options(bool checksums = true) const {
    TieredStateOptions options;
    options.swap_dir = dir_.File("job");
    options.sub_group_elems = kSubGroup;
    options.ram_budget_bytes = kRamSubGroups * kSubGroup * 12;
    options.checksums = checksums;
    return options;
  }

  // A state whose engine breaks as `plan` says; over `memory` instead of the
  // real file when given (it can move any byte count, O_DIRECT cannot).
  absl::StatusOr<std::unique_ptr<TieredOptimizerState>> CreateFaulty(
      FaultPlan plan, MemoryFiles* memory = nullptr) {
    TieredStateSeams seams;
    seams.make_engine =
        [plan, memory](const IoEngineOptions& o) -> absl::StatusOr<std::unique_ptr<IoEngine>> {
      std::unique_ptr<IoBackend> inner;
      if (memory != nullptr) {
        inner = CreateMemoryBackend(memory);
      } else {
        ZO_ASSIGN_OR_RETURN(inner, CreateIoBackend(o));
      }
      return CreateFaultInjectingEngine(o, std::move(inner), plan);
    };
    return TieredOptimizerState::Create(Options(), kTotal, &pool_, std::move(seams));
  }

  // One fault on the first piece of `op` that touches swap slot `slot`.
  static FaultPlan OnSlot(int64_t slot, IoOp op, int error, const SwapLayout& layout) {
    IoFault fault =
        IoFault::FailRange(layout.slot_offset(slot), layout.slot_offset(slot) + 1, error, op);
    fault.times = 1;
    FaultPlan plan;
    plan.faults.push_back(fault);
    return plan;
  }

  // The sticky state: every call but a restore refuses, naming `original`.
  static void ExpectNeedsRestore(TieredOptimizerState& state, const std::string& original) {
    EXPECT_FALSE(state.health().ok());
    std::vector<uint16_t> fp16;
    EXPECT_THAT(RunSteps(state, 50, 1, &fp16),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("needs restore"), HasSubstr(original))));
    EXPECT_THAT(state.IoOnlyPass(),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(original)));
    std::vector<float> out(10);
    EXPECT_THAT(state.ReadState(0, absl::MakeSpan(out), {}, {}),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(original)));
  }

  // After restoring `master` everywhere, one step gives what a state that
  // never failed gives.
  void ExpectRestoredStepMatches(TieredOptimizerState& state, const std::vector<float>& master) {
    ASSERT_THAT(state.health(), IsOk());
    ThreadPool pool(2);
    TieredStateOptions options;
    options.sub_group_elems = kSubGroup;
    ZO_ASSERT_OK_AND_ASSIGN(auto ram, TieredOptimizerState::Create(options, kTotal, &pool));
    ASSERT_THAT(ram->LoadMaster(0, master), IsOk());
    std::vector<uint16_t> want_fp16, got_fp16;
    ASSERT_THAT(RunSteps(*ram, 1, 2, &want_fp16), IsOk());
    ASSERT_THAT(RunSteps(state, 1, 2, &got_fp16), IsOk());
    EXPECT_EQ(FirstDifference(want_fp16, got_fp16), "");
    StateSnapshot want, got;
    ASSERT_THAT(Snapshot(*ram, &want), IsOk());
    ASSERT_THAT(Snapshot(state, &got), IsOk());
    ExpectSameBits(want, got);
  }

  // pwrite of one flipped byte into the swap file, behind the state's back.
  static void FlipByte(const std::string& path, uint64_t offset) {
    const int fd = open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << path;
    unsigned char byte = 0;
    ASSERT_EQ(pread(fd, &byte, 1, static_cast<off_t>(offset)), 1);
    byte ^= 0x5a;
    ASSERT_EQ(pwrite(fd, &byte, 1, static_cast<off_t>(offset)), 1);
    ASSERT_EQ(fsync(fd), 0);
    close(fd);
  }

  const SwapLayout layout_;
  ScopedTempDir dir_;
  ThreadPool pool_{2};
  const std::vector<float> initial_ = Pattern(kTotal, 11);
};

TEST_F(TieredStateFaultTest, EioOnReadFailsTheStep) {
  // Slot 2 is sub-group 3.
  ZO_ASSERT_OK_AND_ASSIGN(auto state, CreateFaulty(OnSlot(2, IoOp::kRead, EIO, layout_)));
  ASSERT_THAT(state->LoadMaster(0, initial_), IsOk());
  std::vector<uint16_t> fp16;
  const absl::Status failed = RunSteps(*state, 1, 1, &fp16);
  EXPECT_THAT(failed, StatusIs(absl::StatusCode::kDataLoss,
                               AllOf(HasSubstr("read of sub-group 3 (elements [30000, 40000))"),
                                     HasSubstr(absl::StrCat("offset ", layout_.slot_offset(2))),
                                     HasSubstr(kSwapFileName), HasSubstr("EIO"))));
  EXPECT_EQ(state->health(), failed);
  ExpectNeedsRestore(*state, "sub-group 3");
  ASSERT_THAT(state->LoadMaster(0, initial_), IsOk());
  ExpectRestoredStepMatches(*state, initial_);
}

TEST_F(TieredStateFaultTest, EioOnWriteFailsTheStep) {
  // A fresh state reads nothing, so the first write of slot 4 is the step's.
  ZO_ASSERT_OK_AND_ASSIGN(auto state, CreateFaulty(OnSlot(4, IoOp::kWrite, EIO, layout_)));
  std::vector<uint16_t> fp16;
  EXPECT_THAT(RunSteps(*state, 1, 1, &fp16),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("write of sub-group 5 (elements [50000, 50003))"),
                             HasSubstr(absl::StrCat("offset ", layout_.slot_offset(4))),
                             HasSubstr("EIO"))));
  ExpectNeedsRestore(*state, "write of sub-group 5");

  // A restore in pieces that cut sub-groups: only the last piece clears it.
  const std::vector<float> m(kTotal, 0.0f), v(kTotal, 0.0f);
  const auto span = [](const std::vector<float>& a) { return absl::MakeConstSpan(a); };
  ASSERT_THAT(state->WriteState(0, span(initial_).first(25'001), span(m).first(25'001),
                                span(v).first(25'001)),
              IsOk());
  ExpectNeedsRestore(*state, "25002 of 50003 not yet rewritten");
  ASSERT_THAT(state->WriteState(25'001, span(initial_).subspan(25'001), span(m).subspan(25'001),
                                span(v).subspan(25'001)),
              IsOk());
  ExpectRestoredStepMatches(*state, initial_);
}

TEST_F(TieredStateFaultTest, ShortReadFailsTheStep) {
  IoFault fault;
  fault.action = IoFault::Action::kShort;
  fault.short_bytes = 100;  // unaligned: the engine cannot go on
  fault.op = IoOp::kRead;
  fault.offset_begin = layout_.slot_offset(1);
  fault.offset_end = layout_.slot_offset(1) + 1;
  FaultPlan plan;
  plan.faults.push_back(fault);
  MemoryFiles memory;
  ZO_ASSERT_OK_AND_ASSIGN(auto state, CreateFaulty(plan, &memory));
  ASSERT_THAT(state->LoadMaster(0, initial_), IsOk());
  std::vector<uint16_t> fp16;
  EXPECT_THAT(RunSteps(*state, 1, 1, &fp16),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("read of sub-group 2"), HasSubstr("short read"),
                             HasSubstr(absl::StrCat("offset ", layout_.slot_offset(1))))));
  ExpectNeedsRestore(*state, "short read");
}

TEST_F(TieredStateFaultTest, AlignedShortReadsAreResumed) {
  IoFault fault;
  fault.action = IoFault::Action::kShort;
  fault.short_bytes = 4096;
  fault.op = IoOp::kRead;
  FaultPlan plan;
  plan.faults.push_back(fault);
  ZO_ASSERT_OK_AND_ASSIGN(auto state, CreateFaulty(plan));
  ASSERT_THAT(state->LoadMaster(0, initial_), IsOk());
  ExpectRestoredStepMatches(*state, initial_);
}

TEST_F(TieredStateFaultTest, EnospcOnWriteFailsTheStep) {
  ZO_ASSERT_OK_AND_ASSIGN(auto state, CreateFaulty(OnSlot(3, IoOp::kWrite, ENOSPC, layout_)));
  std::vector<uint16_t> fp16;
  EXPECT_THAT(RunSteps(*state, 1, 1, &fp16),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("write of sub-group 4"), HasSubstr("ENOSPC"),
                             HasSubstr(absl::StrCat("offset ", layout_.slot_offset(3))))));
  ExpectNeedsRestore(*state, "RESOURCE_EXHAUSTED");
  ASSERT_THAT(state->LoadMaster(0, initial_), IsOk());
  ExpectRestoredStepMatches(*state, initial_);
}

TEST_F(TieredStateFaultTest, FailedLoadNeedsRestoreToo) {
  ZO_ASSERT_OK_AND_ASSIGN(auto state, CreateFaulty(OnSlot(0, IoOp::kWrite, EIO, layout_)));
  EXPECT_THAT(state->LoadMaster(0, initial_),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("write of sub-group 1")));
  ExpectNeedsRestore(*state, "LoadMaster failed");
  ASSERT_THAT(state->LoadMaster(0, initial_), IsOk());
  ExpectRestoredStepMatches(*state, initial_);
}

TEST_F(TieredStateFaultTest, TruncatedSwapFileIsAShortRead) {
  ZO_ASSERT_OK_AND_ASSIGN(auto state, TieredOptimizerState::Create(Options(), kTotal, &pool_));
  ASSERT_THAT(state->LoadMaster(0, initial_), IsOk());
  // Into the last slot only, so that no other read fails first.
  const uint64_t end = layout_.slot_offset(4) + 4096;
  ASSERT_EQ(truncate(state->swap_path().c_str(), static_cast<off_t>(end)), 0);
  std::vector<uint16_t> fp16;
  EXPECT_THAT(RunSteps(*state, 1, 1, &fp16),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("read of sub-group 5"),
                             HasSubstr(absl::StrCat("the file ends at offset ", end)))));
  ExpectNeedsRestore(*state, "sub-group 5");
  ASSERT_THAT(state->LoadMaster(0, initial_), IsOk());
  ExpectRestoredStepMatches(*state, initial_);
}

TEST_F(TieredStateFaultTest, CorruptByteIsCaughtByTheChecksum) {
  ZO_ASSERT_OK_AND_ASSIGN(auto state, TieredOptimizerState::Create(Options(), kTotal, &pool_));
  ASSERT_THAT(state->LoadMaster(0, initial_), IsOk());
  std::vector<uint16_t> fp16;
  ASSERT_THAT(RunSteps(*state, 1, 2, &fp16), IsOk());
  // Element 1234 of m in slot 2 (sub-group 3).
  FlipByte(state->swap_path(), layout_.region_offset(2, kStateM) + 1234 * sizeof(float) + 1);
  EXPECT_THAT(RunSteps(*state, 3, 1, &fp16),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("checksum mismatch in sub-group 3"),
                             HasSubstr(absl::StrCat("the m block 0 at offset ",
                                                    layout_.region_offset(2, kStateM))),
                             HasSubstr(kSwapFileName))));
  ExpectNeedsRestore(*state, "checksum mismatch in sub-group 3");
  ASSERT_THAT(state->LoadMaster(0, initial_), IsOk());
  ExpectRestoredStepMatches(*state, initial_);
}

TEST_F(TieredStateFaultTest, CorruptPaddingIsCaughtByReadState) {
  ZO_ASSERT_OK_AND_ASSIGN(auto state, TieredOptimizerState::Create(Options(), kTotal, &pool_));
  ASSERT_THAT(state->LoadMaster(0, initial_), IsOk());
  // Sub-group 5 holds 3 elements; bytes 12..4095 of its v region are padding.
  FlipByte(state->swap_path(), layout_.region_offset(4, kStateV) + 2000);
  std::vector<float> out(kTotal);
  EXPECT_THAT(state->ReadState(0, absl::MakeSpan(out), {}, {}),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("checksum mismatch in sub-group 5"), HasSubstr("the v"))));
  ExpectNeedsRestore(*state, "ReadState failed");
}

// With checksums off (benchmarks only) nothing notices: the flipped bits
// flow into the update. This is why they are on by default.
TEST_F(TieredStateFaultTest, WithoutChecksumsCorruptionGoesUnnoticed) {
  ZO_ASSERT_OK_AND_ASSIGN(auto state, TieredOptimizerState::Create(Options(false), kTotal, &pool_));
  ASSERT_THAT(state->LoadMaster(0, initial_), IsOk());
  const int64_t element = 3 * kSubGroup + 1234;  // slot 2, element 1234
  FlipByte(state->swap_path(), layout_.region_offset(2, kStateMaster) + 1234 * sizeof(float) + 3);
  std::vector<float> master(1);
  ASSERT_THAT(state->ReadState(element, absl::MakeSpan(master), {}, {}), IsOk());
  EXPECT_NE(master[0], initial_[element]);
  std::vector<uint16_t> fp16;
  EXPECT_THAT(RunSteps(*state, 1, 1, &fp16), IsOk());
  EXPECT_THAT(state->health(), IsOk());
}

TEST_F(TieredStateFaultTest, FullDiskAtCreateNamesTheFile) {
  TieredStateSeams seams;
  seams.preallocate = [](DirectFile&, uint64_t bytes) {
    return ZO_ERRNO_STATUS(ENOSPC, absl::StrCat("fallocate ", bytes, " bytes"));
  };
  const std::string path = absl::StrCat(Options().swap_dir, "/", kSwapFileName);
  EXPECT_THAT(TieredOptimizerState::Create(Options(), kTotal, &pool_, std::move(seams)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr(path), HasSubstr("ENOSPC"),
                             HasSubstr(absl::StrCat(layout_.file_bytes(), " bytes")))));
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(Options().swap_dir));
}

// The real fallocate path: a file size limit makes it fail with EFBIG.
TEST_F(TieredStateFaultTest, RealPreallocationFailureNamesTheFile) {
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = 64 << 10;
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  auto created = TieredOptimizerState::Create(Options(), kTotal, &pool_);
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);
  EXPECT_THAT(created, StatusIs(absl::StatusCode::kResourceExhausted,
                                HasSubstr(absl::StrCat(Options().swap_dir, "/", kSwapFileName))));
}

}  // namespace
}  // namespace zo
