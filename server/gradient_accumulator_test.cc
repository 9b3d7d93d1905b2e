#include "server/gradient_accumulator.h"

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/bf16.h"
#include "common/fp16.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/error_detail.h"

namespace zo {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using testing::IsOk;
using testing::IsOkAndHolds;
using testing::StatusIs;

// Two local chunks: global 1 (10 elements at 0) and global 3 (6 at 10).
const std::vector<LocalChunk> kChunks = {{.id = 1, .local_offset = 0, .elems = 10},
                                         {.id = 3, .local_offset = 10, .elems = 6}};

struct Fixture {
  explicit Fixture(int dp, DType dtype = DType::kFloat32, int pushes_per_rank = 1,
                   bool track_filled = false) {
    auto a = GradientAccumulator::Create({.job = "acc",
                                          .chunks = kChunks,
                                          .dp_world_size = dp,
                                          .pushes_per_rank = pushes_per_rank,
                                          .dtype = dtype,
                                          .pool = &pool,
                                          .wakes = &wakes,
                                          .track_filled = track_filled,
                                          .on_ready = [this] { ++ready_calls; }});
    EXPECT_THAT(a.status(), IsOk());
    acc = *std::move(a);
  }

  // fp32 values at [offset, offset + values.size()) of local chunk `index`.
  absl::Status Push(int index, int64_t step, int rank, int64_t offset, std::vector<float> values,
                    absl::Time deadline = absl::InfiniteFuture(), bool resend = false,
                    int micro_batch = 0) {
    v1::GradientPiece p;
    p.set_micro_batch(micro_batch);
    p.set_job("acc");
    p.set_step(step);
    p.set_dp_rank(rank);
    p.set_chunk(kChunks[index].id);
    p.set_offset(offset);
    p.set_dtype(v1::DTYPE_FP32);
    p.set_resend(resend);
    p.set_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
    return acc->Push(index, ViewOf(p), deadline);
  }
  // Both chunks, every element `value`, for `rank`.
  absl::Status PushAll(int64_t step, int rank, float value) {
    if (absl::Status s = Push(0, step, rank, 0, std::vector<float>(10, value)); !s.ok()) return s;
    return Push(1, step, rank, 0, std::vector<float>(6, value));
  }
  // The buffer of an fp32 job.
  std::vector<float> Data() {
    const float* g = static_cast<const float*>(acc->gradients().own.data);
    return std::vector<float>(g, g + 16);
  }

  WakeQueue wakes;
  ThreadPool pool{2};
  std::atomic<int> ready_calls{0};
  std::unique_ptr<GradientAccumulator> acc;
};

TEST(GradientAccumulatorTest, SumsEveryRankAndIsReadyOnlyWhenAllChunksAreComplete) {
  Fixture f(2);
  EXPECT_EQ(f.acc->local_elems(), 16);
  ASSERT_THAT(f.PushAll(1, 0, 1.5f), IsOk());
  EXPECT_FALSE(f.acc->Ready());
  ASSERT_THAT(f.Push(0, 1, 1, 0, std::vector<float>(10, 2.0f)), IsOk());
  EXPECT_FALSE(f.acc->Ready());
  EXPECT_EQ(f.ready_calls, 0);
  // The last chunk in two pieces.
  ASSERT_THAT(f.Push(1, 1, 1, 4, {4, 5}), IsOk());
  ASSERT_THAT(f.Push(1, 1, 1, 0, {0, 1, 2, 3}), IsOk());
  EXPECT_TRUE(f.acc->Ready());
  EXPECT_EQ(f.ready_calls, 1);
  std::vector<float> want(10, 3.5f);
  for (float v : {0, 1, 2, 3, 4, 5}) want.push_back(1.5f + v);
  EXPECT_THAT(f.Data(), ElementsAreArray(want));
  const StepGradStats stats = f.acc->Stats();
  ASSERT_EQ(stats.per_chunk.size(), 2u);
  EXPECT_DOUBLE_EQ(stats.per_chunk[0].sum_squares, 10 * 3.5 * 3.5);
  EXPECT_FALSE(stats.total.non_finite);
}

// zo.gradient_accumulation "servers": each rank pushes every element once
// per micro-batch; the step is ready when every (rank, micro-batch) has, and
// the buffer holds their sum, in fp32 even with one rank.
// A chunk is reported filled once every rank's and micro-batch's pieces
// of it are in, once per step (a resend changes nothing), and released
// chunks are reported again for the next step.
TEST(GradientAccumulatorTest, ReportsEachChunkOnceWhenItFills) {
  Fixture f(/*dp=*/2, DType::kFloat32, /*pushes_per_rank=*/2, /*track_filled=*/true);
  using ::testing::ElementsAre;
  using ::testing::IsEmpty;
  for (int rank = 0; rank < 2; ++rank) {
    for (int mb = 0; mb < 2; ++mb) {
      EXPECT_THAT(f.acc->TakeFilled(), IsEmpty());
      ASSERT_THAT(
          f.Push(1, 1, rank, 0, std::vector<float>(6, 1.0f), absl::InfiniteFuture(), false, mb),
          IsOk());
    }
  }
  EXPECT_EQ(f.ready_calls, 1);  // the filled chunk woke the step thread
  EXPECT_THAT(f.acc->TakeFilled(), ElementsAre(1));
  ASSERT_THAT(f.Push(1, 1, 1, 0, std::vector<float>(6, 1.0f), absl::InfiniteFuture(),
                     /*resend=*/true, 1),
              IsOk());
  EXPECT_THAT(f.acc->TakeFilled(), IsEmpty());
  for (int rank = 0; rank < 2; ++rank) {
    for (int mb = 0; mb < 2; ++mb) {
      ASSERT_THAT(
          f.Push(0, 1, rank, 0, std::vector<float>(10, 1.0f), absl::InfiniteFuture(), false, mb),
          IsOk());
    }
  }
  EXPECT_TRUE(f.acc->Ready());
  EXPECT_THAT(f.acc->TakeFilled(), ElementsAre(0));
  f.acc->Release(0, 2, 1);
  EXPECT_THAT(f.acc->TakeFilled(), IsEmpty());
  for (int rank = 0; rank < 2; ++rank) {
    for (int mb = 0; mb < 2; ++mb) {
      ASSERT_THAT(
          f.Push(0, 2, rank, 0, std::vector<float>(10, 1.0f), absl::InfiniteFuture(), false, mb),
          IsOk());
    }
  }
  // Released before the step thread looked: not reported for a step it
  // no longer takes.
  f.acc->Release(0, 1, 2);
  EXPECT_THAT(f.acc->TakeFilled(), IsEmpty());
  // Without tracking nothing is reported.
  Fixture untracked(1);
  ASSERT_THAT(untracked.PushAll(1, 0, 1.0f), IsOk());
  EXPECT_THAT(untracked.acc->TakeFilled(), IsEmpty());
}

TEST(GradientAccumulatorTest, MicroBatchPushesAreEachDeliveredOnceAndSummed) {
  Fixture f(/*dp=*/2, DType::kFloat32, /*pushes_per_rank=*/3);
  EXPECT_EQ(f.acc->gradient_dtype(), DType::kFloat32);
  const auto push_all = [&](int rank, int micro, float value) {
    absl::Status s =
        f.Push(0, 1, rank, 0, std::vector<float>(10, value), absl::InfiniteFuture(), false, micro);
    if (s.ok()) {
      s = f.Push(1, 1, rank, 0, std::vector<float>(6, value), absl::InfiniteFuture(), false, micro);
    }
    return s;
  };
  float sum = 0;
  for (int rank = 0; rank < 2; ++rank) {
    for (int micro = 0; micro < 3; ++micro) {
      EXPECT_FALSE(f.acc->Ready());
      const float value = static_cast<float>(1 + rank * 3 + micro);
      ASSERT_THAT(push_all(rank, micro, value), IsOk());
      sum += value;
    }
  }
  EXPECT_TRUE(f.acc->Ready());
  EXPECT_THAT(f.Data(), ElementsAreArray(std::vector<float>(16, sum)));
  // A micro-batch delivered twice, or one the job does not have, changes nothing.
  EXPECT_THAT(push_all(1, 2, 100.0f), StatusIs(absl::StatusCode::kAlreadyExists, ::testing::_));
  EXPECT_THAT(f.Push(0, 1, 0, 0, {1.0f}, absl::InfiniteFuture(), false, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("micro_batch 3")));
  EXPECT_THAT(f.Data(), ElementsAreArray(std::vector<float>(16, sum)));

  // One rank, one push per step: micro-batch 1 is named as not expected.
  Fixture one(1, DType::kFloat32, 1);
  EXPECT_THAT(one.Push(0, 1, 0, 0, {1.0f}, absl::InfiniteFuture(), false, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("zo.gradient_accumulation is not \"servers\"")));
  EXPECT_EQ(GradientAccumulator::Create({.job = "huge",
                                         .chunks = kChunks,
                                         .dp_world_size = 1024,
                                         .pushes_per_rank = 1024,
                                         .wakes = &one.wakes,
                                         .on_ready = {}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GradientAccumulatorTest, ReleaseZeroesAndOpensTheNextStepChunkByChunk) {
  Fixture f(2);
  ASSERT_THAT(f.PushAll(1, 0, 1.0f), IsOk());
  ASSERT_THAT(f.PushAll(1, 1, 2.0f), IsOk());
  // Step 2 waits for the release of its chunk.
  EXPECT_THAT(f.Push(0, 2, 0, 0, std::vector<float>(10, 1.0f), absl::Now()),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("finish updating chunk 1")));
  absl::Status waited;
  std::thread early([&] { waited = f.Push(0, 2, 0, 0, std::vector<float>(10, 7.0f)); });
  while (f.acc->waiting() == 0) std::this_thread::yield();
  // Chunk 0 (elements [0, 10)) is finished once the update passed element 12.
  EXPECT_EQ(f.acc->ReleaseBelow(0, 12, 1), 1u);
  early.join();
  ASSERT_THAT(waited, IsOk());
  EXPECT_FALSE(f.acc->Ready());
  std::vector<float> want(10, 7.0f);  // zeroed, then step 2's push
  want.resize(16, 3.0f);              // chunk 1 still holds step 1
  EXPECT_THAT(f.Data(), ElementsAreArray(want));
  EXPECT_THAT(f.Push(1, 2, 0, 0, std::vector<float>(6, 1.0f), absl::Now()),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("chunk 3")));
  EXPECT_EQ(f.acc->ReleaseBelow(1, 16, 1), 2u);
  want.assign(10, 7.0f);
  want.resize(16, 0.0f);
  EXPECT_THAT(f.Data(), ElementsAreArray(want));
}

// The reactor's way: no thread waits; the kept wake runs on the WakeQueue
// once the chunk is released, and the retry adds the piece.
TEST(GradientAccumulatorTest, TryPushKeepsAWakeInsteadOfWaiting) {
  Fixture f(1);
  ASSERT_THAT(f.PushAll(1, 0, 1.0f), IsOk());
  v1::GradientPiece p;
  p.set_job("acc");
  p.set_step(2);
  p.set_chunk(kChunks[0].id);
  p.set_dtype(v1::DTYPE_FP32);
  const std::vector<float> values(10, 4.0f);
  p.set_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  const GradientPieceView view = ViewOf(p);

  GradientAccumulator::PushWait wait;
  absl::Notification woken;
  ASSERT_THAT(f.acc->TryPush(0, view, &wait, [&] { woken.Notify(); }),
              IsOkAndHolds(GradientAccumulator::PushOutcome::kWaiting));
  EXPECT_NE(wait.ticket, WaitList::kNone);
  EXPECT_EQ(f.acc->waiting(), 1);
  // Releasing the other chunk does not wake it.
  f.acc->Release(1, 2, 1);
  EXPECT_EQ(f.acc->waiting(), 1);
  f.acc->Release(0, 1, 1);
  woken.WaitForNotification();
  EXPECT_EQ(f.acc->waiting(), 0);
  EXPECT_FALSE(f.acc->CancelWait(0, wait)) << "a posted wake cannot be taken back";
  ASSERT_THAT(f.acc->TryPush(0, view, &wait, [] { FAIL() << "no second wait"; }),
              IsOkAndHolds(GradientAccumulator::PushOutcome::kAdded));
  EXPECT_EQ(f.Data()[0], 4.0f);

  // A wake taken back is never run.
  GradientAccumulator::PushWait early;
  p.set_step(3);
  ASSERT_THAT(f.acc->TryPush(0, ViewOf(p), &early, [] { FAIL() << "cancelled wake ran"; }),
              IsOkAndHolds(GradientAccumulator::PushOutcome::kWaiting));
  EXPECT_TRUE(f.acc->CancelWait(0, early));
  f.acc->Release(0, 2, 2);
}

TEST(GradientAccumulatorTest, OneRankStoresAndNeedsNoZeroing) {
  Fixture f(1);
  ASSERT_THAT(f.PushAll(1, 0, 5.0f), IsOk());
  EXPECT_TRUE(f.acc->Ready());
  f.acc->Release(0, 2, 1);
  // Not zeroed: the next step's pushes overwrite every element.
  EXPECT_THAT(f.Data(), ElementsAreArray(std::vector<float>(16, 5.0f)));
  ASSERT_THAT(f.PushAll(2, 0, 2.0f), IsOk());
  EXPECT_THAT(f.Data(), ElementsAreArray(std::vector<float>(16, 2.0f)));
}

// One rank, 16-bit: the buffer is the pushed bits themselves, 2 bytes per
// element, and its statistics are those of the values they stand for.
TEST(GradientAccumulatorTest, OneRankKeepsSixteenBitGradientsAsReceived) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    Fixture f(1, dtype);
    EXPECT_EQ(f.acc->gradient_dtype(), dtype);
    EXPECT_EQ(f.acc->buffer_bytes(), 16 * 2);
    std::vector<uint16_t> bits(16);
    double sum_squares = 0.0;
    for (int i = 0; i < 16; ++i) {
      const float x = 0.37f * static_cast<float>(i - 7);
      bits[i] = dtype == DType::kFloat16 ? FloatToHalfBits(x) : FloatToBf16Bits(x);
      const double back =
          dtype == DType::kFloat16 ? HalfBitsToFloat(bits[i]) : Bf16BitsToFloat(bits[i]);
      sum_squares += back * back;
    }
    for (int index = 0; index < 2; ++index) {
      v1::GradientPiece p;
      p.set_job("acc");
      p.set_step(1);
      p.set_chunk(kChunks[index].id);
      p.set_dtype(dtype == DType::kFloat16 ? v1::DTYPE_FP16 : v1::DTYPE_BF16);
      const uint16_t* first = bits.data() + kChunks[index].local_offset;
      p.set_data(std::string(reinterpret_cast<const char*>(first), kChunks[index].elems * 2));
      ASSERT_THAT(f.acc->Push(index, ViewOf(p), absl::InfiniteFuture()), IsOk());
    }
    ASSERT_TRUE(f.acc->Ready());
    const auto* kept = static_cast<const uint16_t*>(f.acc->gradients().own.data);
    EXPECT_THAT(std::vector<uint16_t>(kept, kept + 16), ElementsAreArray(bits)) << dtype;
    const StepGradStats stats = f.acc->Stats();
    EXPECT_NEAR(stats.per_chunk[0].sum_squares + stats.per_chunk[1].sum_squares, sum_squares,
                1e-9 * sum_squares)
        << dtype;
  }
  // Several ranks add in fp32: 4 bytes per element.
  Fixture several(2, DType::kFloat16);
  EXPECT_EQ(several.acc->gradient_dtype(), DType::kFloat32);
  EXPECT_EQ(several.acc->buffer_bytes(), 16 * 4);
}

TEST(GradientAccumulatorTest, BadPiecesNameWhatIsWrong) {
  Fixture f(2);
  EXPECT_THAT(f.Push(0, 1, 2, 0, {1}), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("dp_rank 2 is outside [0, 2)")));
  EXPECT_THAT(f.Push(0, 1, 0, 8, {1, 2, 3}),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("elements [8, 11)")));
  EXPECT_THAT(f.Push(0, 1, 0, 0, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0 bytes")));
  EXPECT_THAT(f.Push(0, 7, 0, 0, {1}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("step 7 is not open: job acc takes gradients for step 1")));
  // What a restarted worker acts on (it catches up) is the detail.
  const std::optional<v1::ErrorDetail> not_open = DetailOf(f.Push(0, 7, 0, 0, {1}));
  ASSERT_TRUE(not_open.has_value());
  EXPECT_EQ(not_open->reason(), v1::ErrorDetail::STEP_NOT_OPEN);
  EXPECT_EQ(not_open->version(), 1);
  ASSERT_THAT(f.Push(0, 1, 0, 0, {1, 1, 1, 1}), IsOk());
  EXPECT_THAT(f.Push(0, 1, 0, 2, {1, 1, 1}),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("[2, 4)")));
  // A resend adds only what was not delivered.
  ASSERT_THAT(f.Push(0, 1, 0, 2, {9, 9, 9}, absl::InfiniteFuture(), /*resend=*/true), IsOk());
  const std::vector<float> data = f.Data();
  EXPECT_THAT(std::vector<float>(data.begin(), data.begin() + 6),
              ElementsAreArray({1.0f, 1.0f, 1.0f, 1.0f, 9.0f, 0.0f}));
}

// fuzz/corpus/gradient_piece_fuzzer/regression_offset_near_int64_max: the
// message summed offset + n in int64, which overflows for an offset near
// 2^63 off the wire.
TEST(GradientAccumulatorTest, OffsetNearTheInt64LimitIsOutOfRange) {
  Fixture f(1);
  EXPECT_THAT(f.Push(0, 1, 0, INT64_MAX, {1, 2}),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("elements [9223372036854775807, 9223372036854775807 + 2)")));
}

TEST(GradientAccumulatorTest, CloseFailsPushesUntilReopen) {
  Fixture f(1);
  ASSERT_THAT(f.PushAll(1, 0, 1.0f), IsOk());
  absl::Status waited;
  std::thread waiter([&] { waited = f.Push(0, 2, 0, 0, std::vector<float>(10, 1.0f)); });
  while (f.acc->waiting() == 0) std::this_thread::yield();
  f.acc->Close(absl::FailedPreconditionError("job acc needs restore: disk on fire"));
  waiter.join();
  EXPECT_THAT(waited, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("disk on fire")));
  EXPECT_FALSE(f.acc->Ready());
  EXPECT_THAT(f.Push(0, 1, 0, 0, {1}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("disk on fire")));
  f.acc->Reopen();
  EXPECT_TRUE(f.acc->Ready());
}

TEST(GradientAccumulatorTest, ResetAbortsWaitingPushesAndStartsAtTheGivenStep) {
  Fixture f(2);
  ASSERT_THAT(f.PushAll(1, 0, 1.0f), IsOk());
  ASSERT_THAT(f.PushAll(1, 1, 1.0f), IsOk());
  absl::Status waited;
  std::thread waiter([&] { waited = f.Push(0, 2, 0, 0, std::vector<float>(10, 1.0f)); });
  while (f.acc->waiting() == 0) std::this_thread::yield();  // the push waits for chunk 1
  f.acc->Reset(21);
  waiter.join();
  EXPECT_THAT(waited,
              StatusIs(absl::StatusCode::kAborted, HasSubstr("restored to version 20 while")));
  EXPECT_FALSE(f.acc->Ready());
  EXPECT_THAT(f.Data(), ElementsAreArray(std::vector<float>(16, 0.0f)));
  EXPECT_THAT(f.Push(0, 2, 0, 0, {1}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("step 21")));
  ASSERT_THAT(f.PushAll(21, 0, 1.0f), IsOk());
  ASSERT_THAT(f.PushAll(21, 1, 1.0f), IsOk());
  EXPECT_TRUE(f.acc->Ready());
}

}  // namespace
}  // namespace zo
