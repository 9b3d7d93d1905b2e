// Every injected fault surfaces as an error with context, or (short
// transfers, delays, reordering) leaves the data intact.
#include "offload/io/fault_injecting_backend.h"

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/aligned_buffer.h"
#include "offload/io/io_error.h"
#include "offload/io/io_test_util.h"
#include "offload/io/memory_backend.h"

namespace zo {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;
using ::zo::testing::FillPattern;
using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

constexpr int kFd = 3;
constexpr char kPath[] = "/nvme/moments.bin";
constexpr size_t kBlock = 64 * 1024;

class FaultInjectingBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.block_size = kBlock;
    options_.queue_depth = 8;
    ZO_ASSERT_OK_AND_ASSIGN(memory_, AlignedBuffer::Allocate(8 << 20));
    FillPattern(buf(), 4 << 20, 42);
  }

  void MakeEngine(FaultPlan plan) {
    ZO_ASSERT_OK_AND_ASSIGN(
        engine_, CreateFaultInjectingEngine(options_, CreateMemoryBackend(&files_), std::move(plan),
                                            &faults_));
    ASSERT_THAT(engine_->RegisterFile(kFd, kPath), IsOk());
  }

  char* buf(size_t offset = 0) { return memory_.as<char>() + offset; }

  // `n` requests of `len` bytes each, back to back from offset 0, tags 0..n-1.
  std::vector<IoCompletion> Run(IoOp op, int n, size_t len, size_t buf_base = 0) {
    std::vector<IoRequest> reqs;
    for (int i = 0; i < n; ++i) {
      reqs.push_back({op, kFd, i * len, buf(buf_base + i * len), len, static_cast<uint64_t>(i)});
    }
    EXPECT_THAT(engine_->Submit(reqs), IsOk());
    absl::StatusOr<std::vector<IoCompletion>> done = engine_->Reap(n);
    EXPECT_THAT(done, IsOk());
    return done.ok() ? *std::move(done) : std::vector<IoCompletion>{};
  }

  static std::vector<uint64_t> Tags(const std::vector<IoCompletion>& done) {
    std::vector<uint64_t> tags;
    for (const IoCompletion& c : done) tags.push_back(c.tag);
    return tags;
  }

  bool ReadBackMatches(size_t len) {
    std::memset(buf(4 << 20), 0, len);
    EXPECT_THAT(ReadFully(*engine_, kFd, 0, buf(4 << 20), len), IsOk());
    return std::memcmp(buf(), buf(4 << 20), len) == 0;
  }

  IoEngineOptions options_;
  MemoryFiles files_;
  AlignedBuffer memory_;
  std::unique_ptr<IoEngine> engine_;
  FaultInjectingBackend* faults_ = nullptr;
};

TEST_F(FaultInjectingBackendTest, FailTheNthRequestWithEio) {
  FaultPlan plan;
  plan.faults.push_back(IoFault::FailRequest(2, EIO));
  MakeEngine(std::move(plan));
  EXPECT_EQ(engine_->name(), "faulty(memory)");
  std::vector<IoCompletion> done = Run(IoOp::kWrite, 4, 2 * kBlock);
  ASSERT_EQ(done.size(), 4u);
  for (const IoCompletion& c : done) {
    if (c.tag != 2) {
      EXPECT_THAT(c.status, IsOk()) << c.tag;
      continue;
    }
    EXPECT_THAT(c.status, StatusIs(absl::StatusCode::kDataLoss,
                                   AllOf(HasSubstr("write of /nvme/moments.bin at offset 262144"),
                                         HasSubstr("65536 bytes"), HasSubstr("length 131072"),
                                         HasSubstr("Input/output error (EIO)"))));
    EXPECT_EQ(ErrnoOf(c.status), EIO);
  }
  EXPECT_EQ(faults_->injected(), 2);  // both pieces of request 2
}

TEST_F(FaultInjectingBackendTest, FailARangeWithEnospcOnWritesOnly) {
  FaultPlan plan;
  plan.faults.push_back(
      IoFault::FailRange(3 * kBlock + 4096, 3 * kBlock + 8192, ENOSPC, IoOp::kWrite));
  MakeEngine(std::move(plan));
  std::vector<IoCompletion> done = Run(IoOp::kWrite, 6, kBlock);
  for (const IoCompletion& c : done) {
    if (c.tag == 3) {
      EXPECT_THAT(c.status, StatusIs(absl::StatusCode::kResourceExhausted,
                                     AllOf(HasSubstr(kPath), HasSubstr("offset 196608"),
                                           HasSubstr("No space left on device (ENOSPC)"))));
    } else {
      EXPECT_THAT(c.status, IsOk()) << c.tag;
    }
  }
  // Reads of the same range pass; the block never written reads as zeros.
  std::vector<IoCompletion> reads = Run(IoOp::kRead, 6, kBlock, 4 << 20);
  for (const IoCompletion& c : reads) EXPECT_THAT(c.status, IsOk()) << c.tag;
  EXPECT_EQ(std::memcmp(buf(), buf(4 << 20), 3 * kBlock), 0);
  EXPECT_EQ(buf(4 << 20)[3 * kBlock + 100], 0);
}

TEST_F(FaultInjectingBackendTest, ShortTransfersAreRepairedByTheEngine) {
  FaultPlan plan;
  plan.faults.push_back(IoFault::ShortPiece(0));        // half of the first write piece
  plan.faults.push_back(IoFault::ShortPiece(5, 4096));  // 4 KiB of the sixth
  IoFault every_read;                                   // every read piece, halved
  every_read.action = IoFault::Action::kShort;
  every_read.op = IoOp::kRead;
  plan.faults.push_back(every_read);
  MakeEngine(std::move(plan));
  for (const IoCompletion& c : Run(IoOp::kWrite, 3, 3 * kBlock)) EXPECT_THAT(c.status, IsOk());
  EXPECT_EQ(files_.Get(kFd), std::string(buf(), 9 * kBlock));
  EXPECT_TRUE(ReadBackMatches(9 * kBlock));
  EXPECT_GT(faults_->injected(), 9);
}

TEST_F(FaultInjectingBackendTest, DelayedCompletionsComeLaterButComplete) {
  FaultPlan plan;
  plan.faults.push_back(IoFault::DelayPiece(0, 2));
  MakeEngine(std::move(plan));
  std::vector<IoCompletion> done = Run(IoOp::kWrite, 4, kBlock);
  EXPECT_THAT(Tags(done), ElementsAre(1, 2, 0, 3));
  for (const IoCompletion& c : done) EXPECT_THAT(c.status, IsOk());
  EXPECT_TRUE(ReadBackMatches(4 * kBlock));
}

TEST_F(FaultInjectingBackendTest, ADelayLongerThanTheWorkStillEnds) {
  FaultPlan plan;
  plan.faults.push_back(IoFault::DelayPiece(1, 1000));
  MakeEngine(std::move(plan));
  EXPECT_THAT(Tags(Run(IoOp::kWrite, 3, kBlock)), ElementsAre(0, 2, 1));
}

TEST_F(FaultInjectingBackendTest, SlowedPiecesTakeTheirLatencyAndKeepTheData) {
  FaultPlan plan;
  plan.faults.push_back(IoFault::Slow(absl::Milliseconds(30), IoOp::kWrite));
  MakeEngine(std::move(plan));
  const absl::Time start = absl::Now();
  std::vector<IoCompletion> done = Run(IoOp::kWrite, 4, 2 * kBlock);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(30));
  for (const IoCompletion& c : done) EXPECT_THAT(c.status, IsOk()) << c.tag;
  EXPECT_EQ(faults_->injected(), 8);  // every write piece; the reads below pass
  EXPECT_TRUE(ReadBackMatches(8 * kBlock));
  EXPECT_EQ(faults_->injected(), 8);
}

TEST_F(FaultInjectingBackendTest, ReorderingIsSeededAndKeepsTheData) {
  auto order = [&](uint64_t seed) {
    FaultPlan plan;
    plan.seed = seed;
    plan.reorder = true;
    MakeEngine(std::move(plan));
    std::vector<IoCompletion> done = Run(IoOp::kWrite, 8, kBlock);
    for (const IoCompletion& c : done) EXPECT_THAT(c.status, IsOk());
    EXPECT_TRUE(ReadBackMatches(8 * kBlock));
    return Tags(done);
  };
  const std::vector<uint64_t> first = order(7);
  EXPECT_EQ(order(7), first);
  EXPECT_THAT(first, UnorderedElementsAreArray({0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_NE(first, (std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST_F(FaultInjectingBackendTest, SeededRandomFaultsRepeat) {
  auto failed = [&](uint64_t seed) {
    FaultPlan plan;
    plan.seed = seed;
    plan.faults.push_back(IoFault::FailRandomly(0.5, EIO));
    MakeEngine(std::move(plan));
    std::vector<uint64_t> tags;
    for (const IoCompletion& c : Run(IoOp::kWrite, 32, 4096)) {
      if (!c.status.ok()) {
        EXPECT_THAT(c.status, StatusIs(absl::StatusCode::kDataLoss, HasSubstr(kPath)));
        tags.push_back(c.tag);
      }
    }
    return tags;
  };
  const std::vector<uint64_t> first = failed(11);
  EXPECT_EQ(failed(11), first);
  EXPECT_GT(first.size(), 0u);
  EXPECT_LT(first.size(), 32u);
}

TEST_F(FaultInjectingBackendTest, TimesLimitsAFault) {
  FaultPlan plan;
  IoFault twice = IoFault::FailRandomly(1.0, EIO);
  twice.times = 2;
  plan.faults.push_back(twice);
  MakeEngine(std::move(plan));
  int failures = 0;
  for (const IoCompletion& c : Run(IoOp::kWrite, 5, 4096)) failures += !c.status.ok();
  EXPECT_EQ(failures, 2);
}

}  // namespace
}  // namespace zo
