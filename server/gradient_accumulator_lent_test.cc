// Pieces an in-process worker lends (GradientAccumulator::TryPush with
// `lent`): their whole gradient blocks are read where the worker keeps
// them, the rest is copied, and the owner is kept until the chunk is
// released or the accumulator reset. What the step reads is what a copy
// would have held, bit for bit.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "server/gradient_accumulator.h"

namespace zo {
namespace {

using testing::IsOk;

constexpr int64_t kB = kGradientBlockElems;
// Two chunks that start on blocks; the second ends in a short block.
const std::vector<LocalChunk> kChunks = {{.id = 0, .local_offset = 0, .elems = 3 * kB},
                                         {.id = 1, .local_offset = 3 * kB, .elems = kB + 500}};
constexpr int64_t kElems = 4 * kB + 500;

struct Lender {
  explicit Lender(bool reads_lent = true, int dp = 1, std::vector<LocalChunk> chunks = kChunks) {
    auto a = GradientAccumulator::Create({.job = "lent",
                                          .chunks = std::move(chunks),
                                          .dp_world_size = dp,
                                          .dtype = DType::kBFloat16,
                                          .pool = &pool,
                                          .wakes = &wakes,
                                          .reads_lent = reads_lent});
    EXPECT_THAT(a.status(), IsOk());
    acc = *std::move(a);
  }

  // bf16 bits [offset, offset + n) of `grad` into local chunk `index`, lent
  // with `owner` when it is set.
  absl::Status Push(int index, int64_t step, int64_t offset, int64_t n,
                    const std::vector<uint16_t>& grad, std::shared_ptr<const void> owner) {
    GradientPieceView p;
    p.job = "lent";
    p.step = step;
    p.chunk = kChunks[static_cast<size_t>(index)].id;
    p.offset = offset;
    p.dtype = v1::DTYPE_BF16;
    const uint16_t* first = grad.data() + kChunks[static_cast<size_t>(index)].local_offset + offset;
    p.data = {{reinterpret_cast<const char*>(first), static_cast<size_t>(n) * 2}};
    p.data_bytes = static_cast<size_t>(n) * 2;
    GradientAccumulator::PushWait wait;
    absl::StatusOr<GradientAccumulator::PushOutcome> outcome = acc->TryPush(
        index, p, &wait, [] {}, std::move(owner));
    if (!outcome.ok()) return outcome.status();
    EXPECT_EQ(*outcome, GradientAccumulator::PushOutcome::kAdded);
    return absl::OkStatus();
  }

  // Every element as the step reads it, block by block.
  std::vector<uint16_t> Read() const {
    std::vector<uint16_t> out(kElems);
    const GradientSource g = acc->gradients();
    for (int64_t at = 0; at < kElems; at += kB) {
      const int64_t n = std::min(kB, kElems - at);
      std::memcpy(out.data() + at, g.At(at, n).data, static_cast<size_t>(n) * 2);
    }
    return out;
  }

  WakeQueue wakes;
  ThreadPool pool{2};
  std::unique_ptr<GradientAccumulator> acc;
};

std::vector<uint16_t> Gradient(int64_t step) {
  std::vector<uint16_t> g(kElems);
  for (int64_t i = 0; i < kElems; ++i) {
    g[i] = FloatToBf16Bits(0.01f * static_cast<float>((i * 7 + step * 3) % 41 - 20));
  }
  return g;
}

const std::byte* Byte(const std::vector<uint16_t>& g, int64_t i) {
  return reinterpret_cast<const std::byte*>(g.data() + i);
}

// Chunk 0 gets a lent piece from mid-block 0 to mid-block 2 and the rest
// copied; chunk 1 one lent piece to its end.
void PushStep(Lender& l, int64_t step, const std::vector<uint16_t>& g,
              const std::shared_ptr<const void>& owner0,
              const std::shared_ptr<const void>& owner1) {
  ASSERT_THAT(l.Push(0, step, 100, 2 * kB + 50, g, owner0), IsOk());
  ASSERT_THAT(l.Push(0, step, 0, 100, g, nullptr), IsOk());
  ASSERT_THAT(l.Push(0, step, 2 * kB + 150, kB - 150, g, nullptr), IsOk());
  ASSERT_THAT(l.Push(1, step, 0, kB + 500, g, owner1), IsOk());
  ASSERT_TRUE(l.acc->Ready());
}

TEST(GradientAccumulatorLentTest, WholeBlocksAreReadWhereTheyAreAndTheRestIsCopied) {
  Lender l;
  Lender copied(/*reads_lent=*/false);
  ASSERT_TRUE(l.acc->reads_lent());
  ASSERT_FALSE(copied.acc->reads_lent());
  const std::vector<uint16_t> g = Gradient(1);
  PushStep(l, 1, g, std::make_shared<int>(0), std::make_shared<int>(1));
  PushStep(copied, 1, g, std::make_shared<int>(0), std::make_shared<int>(1));

  const GradientSource s = l.acc->gradients();
  const auto* own = static_cast<const std::byte*>(s.own.data);
  EXPECT_EQ(s.At(kB, kB).data, Byte(g, kB)) << "block 1 lies wholly in the first lent piece";
  EXPECT_EQ(s.At(3 * kB, kB).data, Byte(g, 3 * kB));
  EXPECT_EQ(s.At(4 * kB, 500).data, Byte(g, 4 * kB)) << "the short last block, lent whole";
  EXPECT_EQ(s.At(0, kB).data, own) << "block 0 is partly the lent piece's: copied";
  EXPECT_EQ(s.At(2 * kB, kB).data, own + 2 * kB * 2);
  EXPECT_EQ(copied.acc->gradients().At(kB, kB).data,
            static_cast<const std::byte*>(copied.acc->gradients().own.data) + kB * 2);

  EXPECT_EQ(l.Read(), g);
  EXPECT_EQ(copied.Read(), g);
  const StepGradStats lent = l.acc->Stats();
  const StepGradStats twin = copied.acc->Stats();
  ASSERT_EQ(lent.per_chunk.size(), 2u);
  for (size_t c = 0; c < 2; ++c) {
    EXPECT_EQ(lent.per_chunk[c].sum_squares, twin.per_chunk[c].sum_squares) << "chunk " << c;
  }
  EXPECT_EQ(lent.total.sum_squares, twin.total.sum_squares);
  EXPECT_EQ(l.acc->ChunkStats({1, 0})[0].sum_squares, twin.per_chunk[1].sum_squares);
}

TEST(GradientAccumulatorLentTest, AnOwnerIsKeptUntilItsChunkIsReleased) {
  Lender l;
  std::vector<uint16_t> g = Gradient(1);
  auto owner0 = std::make_shared<int>(0);
  auto owner1 = std::make_shared<int>(1);
  const std::weak_ptr<int> kept0 = owner0;
  const std::weak_ptr<int> kept1 = owner1;
  PushStep(l, 1, g, owner0, owner1);
  owner0.reset();
  owner1.reset();
  EXPECT_FALSE(kept0.expired());
  EXPECT_FALSE(kept1.expired());

  l.acc->Release(0, 1, 1);
  EXPECT_TRUE(kept0.expired()) << "chunk 0 is done with step 1";
  EXPECT_FALSE(kept1.expired());
  l.acc->Release(1, 2, 1);
  EXPECT_TRUE(kept1.expired());
  EXPECT_EQ(l.acc->gradients().At(3 * kB, kB).data,
            static_cast<const std::byte*>(l.acc->gradients().own.data) + 3 * kB * 2)
      << "a released block is the buffer's again";

  // Step 2, copied where nothing is lent: the bytes of step 2, not the
  // lent ones of step 1 (the caller's, changed since).
  const std::vector<uint16_t> g2 = Gradient(2);
  ASSERT_THAT(l.Push(0, 2, 0, 3 * kB, g2, nullptr), IsOk());
  ASSERT_THAT(l.Push(1, 2, 0, kB + 500, g2, nullptr), IsOk());
  std::fill(g.begin(), g.end(), uint16_t{0});
  EXPECT_EQ(l.Read(), g2);
}

TEST(GradientAccumulatorLentTest, AResetLetsGoOfEveryOwner) {
  Lender l;
  const std::vector<uint16_t> g = Gradient(1);
  auto owner = std::make_shared<int>(0);
  const std::weak_ptr<int> kept = owner;
  ASSERT_THAT(l.Push(1, 1, 0, kB + 500, g, std::move(owner)), IsOk());
  EXPECT_FALSE(kept.expired());
  l.acc->Close(absl::AbortedError("restoring"));
  l.acc->Reset(1);
  EXPECT_TRUE(kept.expired());
  EXPECT_EQ(l.acc->gradients().At(3 * kB, kB).data,
            static_cast<const std::byte*>(l.acc->gradients().own.data) + 3 * kB * 2);
}

// Where blocks cannot be lent the piece is copied and its owner let go at
// once: no whole block in the piece, several ranks summing into fp32, a
// chunk not starting on a block.
TEST(GradientAccumulatorLentTest, WhatCannotBeReadInPlaceIsCopied) {
  const std::vector<uint16_t> g = Gradient(1);
  {
    Lender l;
    auto owner = std::make_shared<int>(0);
    const std::weak_ptr<int> kept = owner;
    ASSERT_THAT(l.Push(0, 1, 10, kB, g, std::move(owner)), IsOk());
    EXPECT_TRUE(kept.expired()) << "no block lies wholly in [10, 10 + kB)";
  }
  {
    Lender two_ranks(/*reads_lent=*/true, /*dp=*/2);
    EXPECT_FALSE(two_ranks.acc->reads_lent());
  }
  {
    Lender off_grid(/*reads_lent=*/true, /*dp=*/1,
                    {{.id = 0, .local_offset = 0, .elems = kB + 8},
                     {.id = 1, .local_offset = kB + 8, .elems = kB}});
    EXPECT_FALSE(off_grid.acc->reads_lent());
  }
  {
    Lender l(/*reads_lent=*/false);
    auto owner = std::make_shared<int>(0);
    const std::weak_ptr<int> kept = owner;
    ASSERT_THAT(l.Push(1, 1, 0, kB + 500, g, std::move(owner)), IsOk());
    EXPECT_TRUE(kept.expired());
  }
}

// What tells the speculation whether pushes take the server's cores
// (server/job_speculation.cc): a step whose blocks were all lent whole
// copied nothing; a piece copied whole, or ranks summed, did.
TEST(GradientAccumulatorLentTest, AStepSaysWhetherItsPushesWereCopied) {
  Lender l;
  const std::vector<uint16_t> g = Gradient(1);
  ASSERT_THAT(l.Push(0, 1, 0, 3 * kB, g, std::make_shared<int>(0)), IsOk());
  ASSERT_THAT(l.Push(1, 1, 0, kB + 500, g, std::make_shared<int>(1)), IsOk());
  ASSERT_TRUE(l.acc->Ready());
  EXPECT_FALSE(l.acc->CopiedPushes(1)) << "every block was lent whole";
  l.acc->Release(0, 2, 1);

  // Step 2: a lent piece's end inside a block is copied, a small part of
  // it; a piece with no owner to keep is copied whole.
  const std::vector<uint16_t> g2 = Gradient(2);
  ASSERT_THAT(l.Push(0, 2, 0, kB + 10, g2, std::make_shared<int>(2)), IsOk());
  EXPECT_FALSE(l.acc->CopiedPushes(2));
  ASSERT_THAT(l.Push(0, 2, kB + 10, 2 * kB - 10, g2, nullptr), IsOk());
  EXPECT_TRUE(l.acc->CopiedPushes(2));
  EXPECT_FALSE(l.acc->CopiedPushes(3)) << "a later step has copied nothing yet";

  Lender summed(/*reads_lent=*/true, /*dp=*/2);
  ASSERT_THAT(summed.Push(1, 1, 0, kB + 500, g, std::make_shared<int>(3)), IsOk());
  EXPECT_TRUE(summed.acc->CopiedPushes(1)) << "two ranks are summed into the buffer";
}

}  // namespace
}  // namespace zo
