// The engine's own logic (checks, splitting, queue depth, resubmission,
// error wording) over in-memory files and a scripted backend.
#include "offload/io/block_io_engine.h"

#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
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
using ::zo::testing::FillPattern;
using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

constexpr int kFd = 5;
constexpr char kPath[] = "/nvme/opt_state.bin";
constexpr size_t kKiB = 1024;

// Completes pieces against MemoryFiles, records what it saw, and lets a
// test rewrite results (`edit` gets the piece and the real result).
class ScriptedBackend : public IoBackend {
 public:
  explicit ScriptedBackend(MemoryFiles* files) : files_(files) {}
  ~ScriptedBackend() override {
    if (pending_at_destruction != nullptr) *pending_at_destruction = pending_.size();
  }
  std::string_view name() const override { return "scripted"; }
  void Submit(absl::Span<const IoPiece> pieces) override {
    for (const IoPiece& p : pieces) {
      pieces_.push_back(p);
      int64_t r = p.op == IoOp::kRead ? files_->Read(p.fd, p.offset, p.buf, p.len)
                                      : files_->Write(p.fd, p.offset, p.buf, p.len);
      if (edit) r = edit(p, r);
      pending_.push_back({p.id, r});
    }
    max_in_flight_ = std::max(max_in_flight_, pending_.size());
  }
  absl::Status Wait(size_t min_results, std::vector<IoPieceResult>* out) override {
    if (!broken.ok()) return broken;
    if (pending_.size() < min_results) return absl::InternalError("scripted: too few pieces");
    // One result per call at most when asked for one: the engine must cope.
    const size_t n = min_results == 0 ? pending_.size() : min_results;
    out->insert(out->end(), pending_.begin(), pending_.begin() + n);
    pending_.erase(pending_.begin(), pending_.begin() + n);
    return absl::OkStatus();
  }

  std::function<int64_t(const IoPiece&, int64_t)> edit;
  absl::Status broken;
  size_t* pending_at_destruction = nullptr;
  const std::vector<IoPiece>& pieces() const { return pieces_; }
  size_t max_in_flight() const { return max_in_flight_; }
  size_t pending() const { return pending_.size(); }

 private:
  MemoryFiles* const files_;
  std::vector<IoPiece> pieces_;
  std::vector<IoPieceResult> pending_;
  size_t max_in_flight_ = 0;
};

class BlockIoEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.block_size = 64 * kKiB;
    options_.queue_depth = 3;
    ASSERT_THAT(MakeEngine(), IsOk());
    ZO_ASSERT_OK_AND_ASSIGN(memory_, AlignedBuffer::Allocate(4 << 20));
  }

  absl::Status MakeEngine() {
    auto backend = std::make_unique<ScriptedBackend>(&files_);
    backend_ = backend.get();
    engine_.reset();
    absl::StatusOr<std::unique_ptr<IoEngine>> engine =
        NewBlockIoEngine(options_, std::move(backend));
    if (!engine.ok()) return engine.status();
    engine_ = std::move(*engine);
    return engine_->RegisterFile(kFd, kPath);
  }

  char* buf(size_t offset = 0) { return memory_.as<char>() + offset; }

  absl::StatusOr<std::vector<IoCompletion>> RunAll() { return engine_->Reap(engine_->in_flight()); }

  IoEngineOptions options_;
  MemoryFiles files_;
  ScriptedBackend* backend_ = nullptr;
  std::unique_ptr<IoEngine> engine_;
  AlignedBuffer memory_;
};

TEST_F(BlockIoEngineTest, SplitsIntoBlocksKeepsQueueDepthAndReapsWholeRequests) {
  FillPattern(buf(), 1 << 20, 1);
  const size_t a = 200 * kKiB, b = 4 * kKiB, c = 132 * kKiB;
  ASSERT_THAT(engine_->Submit({{IoOp::kWrite, kFd, 0, buf(), a, 10},
                               {IoOp::kWrite, kFd, a, buf(a), b, 11},
                               {IoOp::kWrite, kFd, a + b, buf(a + b), c, 12}}),
              IsOk());
  EXPECT_EQ(engine_->in_flight(), 3u);
  ZO_ASSERT_OK_AND_ASSIGN(std::vector<IoCompletion> done, RunAll());
  ASSERT_EQ(done.size(), 3u);
  for (const IoCompletion& c : done) EXPECT_THAT(c.status, IsOk()) << c.tag;
  EXPECT_EQ(done[0].tag, 10u);
  EXPECT_EQ(engine_->in_flight(), 0u);
  EXPECT_LE(backend_->max_in_flight(), 3u);
  // 200 KiB -> 64+64+64+8, 4 KiB -> 4, 132 KiB -> 64+64+4: contiguous, in order.
  std::vector<size_t> lens;
  uint64_t next = 0;
  for (const IoPiece& p : backend_->pieces()) {
    EXPECT_EQ(p.offset, next);
    next += p.len;
    lens.push_back(p.len / kKiB);
  }
  EXPECT_THAT(lens, ElementsAre(64, 64, 64, 8, 4, 64, 64, 4));
  EXPECT_EQ(files_.Get(kFd), std::string(buf(), a + b + c));

  std::memset(buf(1 << 20), 0, a + b + c);
  ASSERT_THAT(ReadFully(*engine_, kFd, 0, buf(1 << 20), a + b + c), IsOk());
  EXPECT_EQ(std::memcmp(buf(), buf(1 << 20), a + b + c), 0);
}

TEST_F(BlockIoEngineTest, ZeroLengthCompletesAtOnce) {
  ASSERT_THAT(engine_->Submit({{IoOp::kRead, kFd, 0, nullptr, 0, 7}}), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(std::vector<IoCompletion> done, engine_->Reap(0));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].tag, 7u);
  EXPECT_THAT(done[0].status, IsOk());
  EXPECT_TRUE(backend_->pieces().empty());
}

TEST_F(BlockIoEngineTest, MisalignedRequestsAreRejectedBeforeAnythingStarts) {
  const IoRequest good{IoOp::kRead, kFd, 0, buf(), 4096, 1};
  struct Case {
    IoRequest bad;
    const char* why;
  } cases[] = {
      {{IoOp::kRead, kFd, 512, buf(), 4096, 2}, "offset is not a multiple of 4096"},
      {{IoOp::kRead, kFd, 0, buf(), 4000, 2}, "length is not a multiple of 4096"},
      {{IoOp::kWrite, kFd, 0, buf(8), 4096, 2}, "buffer address is not a multiple of 4096"},
      {{IoOp::kRead, kFd, 0, nullptr, 4096, 2}, "null buffer"},
      {{IoOp::kRead, 99, 0, buf(), 4096, 2}, "fd 99 is not registered"},
      {{IoOp::kRead, kFd, ~uint64_t{0} - 4095, buf(), 8192, 2}, "does not fit in off_t"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(engine_->Submit({good, c.bad}),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("request #1"), HasSubstr(c.why))));
    EXPECT_EQ(engine_->in_flight(), 0u) << "nothing of a rejected batch may be queued";
  }
  EXPECT_THAT(engine_->Submit({{IoOp::kRead, kFd, 512, buf(), 4096, 2}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(kPath), HasSubstr("offset 512"), HasSubstr("length 4096"))));
  EXPECT_TRUE(backend_->pieces().empty());
}

TEST_F(BlockIoEngineTest, OtherAlignmentsCanBeChosen) {
  options_.alignment = 512;
  ASSERT_THAT(MakeEngine(), IsOk());
  ASSERT_THAT(WriteFully(*engine_, kFd, 512, buf(), 1024), IsOk());
  EXPECT_EQ(files_.Get(kFd).size(), 1536u);
}

TEST_F(BlockIoEngineTest, ShortTransfersAreResubmittedForTheRest) {
  FillPattern(buf(), 256 * kKiB, 2);
  int cuts = 0;
  backend_->edit = [&](const IoPiece& p, int64_t r) -> int64_t {
    if (p.len == 64 * kKiB && cuts < 3) {  // the kernel moved only part of it
      ++cuts;
      return r > 0 ? 12 * kKiB : r;
    }
    return r;
  };
  ASSERT_THAT(WriteFully(*engine_, kFd, 0, buf(), 256 * kKiB), IsOk());
  EXPECT_EQ(cuts, 3);
  ASSERT_THAT(ReadFully(*engine_, kFd, 0, buf(1 << 20), 256 * kKiB), IsOk());
  EXPECT_EQ(std::memcmp(buf(), buf(1 << 20), 256 * kKiB), 0);
  // The remainder starts where the short count ended.
  bool saw_remainder = false;
  for (const IoPiece& p : backend_->pieces()) saw_remainder |= p.len == 52 * kKiB;
  EXPECT_TRUE(saw_remainder);
}

TEST_F(BlockIoEngineTest, ShortReadAtEndOfFileIsDataLossNamingTheOffset) {
  files_.Set(kFd, std::string(72 * kKiB, 'x'));
  EXPECT_THAT(
      ReadFully(*engine_, kFd, 0, buf(), 128 * kKiB),
      StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr("read of /nvme/opt_state.bin"),
                                                  HasSubstr("the file ends at offset 73728"),
                                                  HasSubstr("requested end at 131072"))));
  files_.Set(kFd, std::string(5000, 'x'));  // unaligned size: O_DIRECT returns a partial block
  EXPECT_THAT(ReadFully(*engine_, kFd, 0, buf(), 8 * kKiB),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("the file ends at offset 5000")));
}

TEST_F(BlockIoEngineTest, FullDiskIsResourceExhaustedNamingTheFile) {
  files_.set_capacity(100 * kKiB);  // the second piece gets 36 KiB in, its rest ENOSPC
  const absl::Status status = WriteFully(*engine_, kFd, 0, buf(), 128 * kKiB);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kResourceExhausted,
                               AllOf(HasSubstr("write of /nvme/opt_state.bin at offset 102400"),
                                     HasSubstr("No space left on device (ENOSPC)"))));
  EXPECT_EQ(ErrnoOf(status), ENOSPC);
}

TEST_F(BlockIoEngineTest, InterruptedPiecesAreRetriedThenReported) {
  int again = 2;
  backend_->edit = [&](const IoPiece&, int64_t r) -> int64_t { return again-- > 0 ? -EAGAIN : r; };
  EXPECT_THAT(WriteFully(*engine_, kFd, 0, buf(), 4096), IsOk());
  backend_->edit = [](const IoPiece&, int64_t) -> int64_t { return -EINTR; };
  EXPECT_THAT(WriteFully(*engine_, kFd, 0, buf(), 4096),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("EINTR")));
}

TEST_F(BlockIoEngineTest, AFailedPieceStopsTheRestOfItsRequestOnly) {
  options_.queue_depth = 1;
  ASSERT_THAT(MakeEngine(), IsOk());
  backend_->edit = [](const IoPiece& p, int64_t r) -> int64_t {
    return p.request_index == 0 && p.offset == 64 * kKiB ? -EIO : r;
  };
  ASSERT_THAT(engine_->Submit({{IoOp::kWrite, kFd, 0, buf(), 256 * kKiB, 1},
                               {IoOp::kWrite, kFd, 256 * kKiB, buf(), 64 * kKiB, 2}}),
              IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(std::vector<IoCompletion> done, RunAll());
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].tag, 1u);
  EXPECT_THAT(done[0].status,
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("write of /nvme/opt_state.bin at offset 65536 (65536 bytes; "
                                       "request offset 0, length 262144)"),
                             HasSubstr("Input/output error (EIO)"))));
  EXPECT_THAT(done[1].status, IsOk());
  EXPECT_EQ(backend_->pieces().size(), 3u);  // two of request 1, one of request 2
}

TEST_F(BlockIoEngineTest, ABackendThatMovesTooMuchIsInternal) {
  backend_->edit = [](const IoPiece& p, int64_t) -> int64_t { return p.len + 1; };
  EXPECT_THAT(WriteFully(*engine_, kFd, 0, buf(), 4096),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("4097 bytes moved")));
}

TEST_F(BlockIoEngineTest, ReapChecksItsArgumentAndZeroDoesNotBlock) {
  EXPECT_THAT(engine_->Reap(1), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("more than the 0 requests in flight")));
  ZO_ASSERT_OK_AND_ASSIGN(std::vector<IoCompletion> none, engine_->Reap(0));
  EXPECT_TRUE(none.empty());
}

TEST_F(BlockIoEngineTest, SyncHelpersRefuseWhileRequestsAreInFlight) {
  ASSERT_THAT(engine_->Submit({{IoOp::kWrite, kFd, 0, buf(), 4096, 1}}), IsOk());
  EXPECT_THAT(ReadFully(*engine_, kFd, 0, buf(), 4096),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("in flight")));
  EXPECT_THAT(engine_->UnregisterFile(kFd),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(kPath)));
  ASSERT_THAT(RunAll(), IsOk());
  EXPECT_THAT(engine_->UnregisterFile(kFd), IsOk());
  EXPECT_THAT(engine_->UnregisterFile(kFd), StatusIs(absl::StatusCode::kNotFound, HasSubstr("5")));
}

TEST_F(BlockIoEngineTest, RegisteringTwiceIsAnError) {
  EXPECT_THAT(engine_->RegisterFile(kFd, "/other"),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr(kPath)));
}

TEST_F(BlockIoEngineTest, ABrokenBackendBreaksTheEngineForGood) {
  ASSERT_THAT(engine_->Submit({{IoOp::kWrite, kFd, 0, buf(), 4096, 1}}), IsOk());
  backend_->broken = absl::InternalError("ring gone");
  EXPECT_THAT(engine_->Reap(1), StatusIs(absl::StatusCode::kInternal, HasSubstr("ring gone")));
  EXPECT_THAT(engine_->Submit({{IoOp::kWrite, kFd, 0, buf(), 4096, 2}}),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("scripted engine broke")));
  backend_->broken = absl::OkStatus();  // lets the destructor drain
}

TEST_F(BlockIoEngineTest, DestructionWaitsForPiecesInFlight) {
  size_t left = 99;
  backend_->pending_at_destruction = &left;
  ASSERT_THAT(engine_->Submit({{IoOp::kWrite, kFd, 0, buf(), 1 << 20, 1}}), IsOk());
  EXPECT_EQ(backend_->pending(), 3u);
  engine_.reset();
  EXPECT_EQ(left, 0u);
}

TEST(IoEngineOptionsTest, ValidationNamesTheOption) {
  IoEngineOptions o;
  EXPECT_THAT(ValidateIoEngineOptions(o), IsOk());
  o.block_size = 3 << 20;
  EXPECT_THAT(ValidateIoEngineOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_size = 3145728")));
  o = {};
  o.queue_depth = 0;
  EXPECT_THAT(ValidateIoEngineOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("queue_depth = 0")));
  o = {};
  o.alignment = 3000;
  EXPECT_THAT(ValidateIoEngineOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("alignment = 3000")));
  MemoryFiles files;
  EXPECT_THAT(CreateMemoryEngine(o, &files),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("alignment")));
}

TEST(IoEngineOptionsTest, ComeFromTheAioSection) {
  AioConfig aio;
  aio.block_size = 4 << 20;
  aio.queue_depth = 32;
  aio.single_submit = true;
  const IoEngineOptions o = IoEngineOptionsFromConfig(aio);
  EXPECT_EQ(o.block_size, size_t{4} << 20);
  EXPECT_EQ(o.queue_depth, 32);
  EXPECT_TRUE(o.single_submit);
  EXPECT_EQ(IoEngineOptionsFromConfig(AioConfig{}).block_size, size_t{1} << 20);
  EXPECT_EQ(IoEngineOptionsFromConfig(AioConfig{}).queue_depth, 8);
}

}  // namespace
}  // namespace zo
