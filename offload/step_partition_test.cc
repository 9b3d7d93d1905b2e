#include "offload/step_partition.h"

#include <cstdlib>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Checks every property the step relies on, independently of how the
// partition computes it.
void CheckPartition(const std::vector<size_t>& sizes, int workers) {
  SCOPED_TRACE(::testing::Message() << "workers=" << workers << " chunks=" << sizes.size());
  const StepPartition part(sizes, workers);
  ASSERT_EQ(part.workers(), workers);
  std::vector<size_t> starts(sizes.size() + 1, 0);
  for (size_t c = 0; c < sizes.size(); ++c) starts[c + 1] = starts[c] + sizes[c];
  const size_t total = starts.back();
  ASSERT_EQ(part.total(), total);

  std::vector<std::vector<int>> owners(sizes.size());
  for (size_t c = 0; c < sizes.size(); ++c) owners[c].assign(sizes[c], 0);
  EXPECT_EQ(part.piece_begin(0), 0u);
  EXPECT_EQ(part.piece_end(workers - 1), total);
  for (int w = 0; w < workers; ++w) {
    const size_t begin = part.piece_begin(w);
    const size_t end = part.piece_end(w);
    ASSERT_LE(begin, end);
    if (w > 0) {
      EXPECT_EQ(begin, part.piece_end(w - 1));
    }
    // Nearly even, whatever the chunk sizes.
    const double ideal = static_cast<double>(total) / workers;
    EXPECT_LE(std::abs(static_cast<double>(end - begin) - ideal), kStepAlignElems + 1.0);
    // A boundary inside the index space is a line boundary of its chunk or a
    // chunk end.
    if (end != total) {
      bool ok = false;
      for (size_t c = 0; c < sizes.size(); ++c) {
        if (end == starts[c + 1]) ok = true;
        if (end >= starts[c] && end < starts[c + 1] && (end - starts[c]) % kStepAlignElems == 0) {
          ok = true;
        }
      }
      EXPECT_TRUE(ok) << "boundary " << end << " of worker " << w;
    }
    // The segments are the piece, in order, with nothing empty.
    size_t next = begin;
    size_t last_chunk = 0;
    bool first = true;
    for (const Segment& s : part.segments(w)) {
      ASSERT_LT(s.chunk, sizes.size());
      ASSERT_LT(s.begin, s.end);
      ASSERT_LE(s.end, sizes[s.chunk]);
      if (!first) {
        EXPECT_GT(s.chunk, last_chunk);
      }
      EXPECT_EQ(starts[s.chunk] + s.begin, next);
      next = starts[s.chunk] + s.end;
      for (size_t i = s.begin; i < s.end; ++i) ++owners[s.chunk][i];
      last_chunk = s.chunk;
      first = false;
    }
    EXPECT_EQ(next, end);
  }
  for (size_t c = 0; c < sizes.size(); ++c) {
    for (size_t i = 0; i < sizes[c]; ++i) {
      ASSERT_EQ(owners[c][i], 1) << "chunk " << c << " element " << i;
    }
  }
}

TEST(StepPartitionTest, PieceSpansChunksAndSnapsToLines) {
  const StepPartition part(std::vector<size_t>{100, 7, 50}, 2);
  // Ideal split at 78 moves up to the line boundary 80 of chunk 0.
  EXPECT_EQ(part.piece_end(0), 80u);
  EXPECT_THAT(part.segments(0), ElementsAre(Segment{0, 0, 80}));
  EXPECT_THAT(part.segments(1),
              ElementsAre(Segment{0, 80, 100}, Segment{1, 0, 7}, Segment{2, 0, 50}));
}

TEST(StepPartitionTest, BoundaryInsideShortChunkSnapsToItsEnd) {
  // Ideal split at 15 falls in chunk 1 ([10, 20)) at offset 5; its next line
  // boundary is past the chunk's end, so the piece ends with the chunk.
  const StepPartition part(std::vector<size_t>{10, 10, 10}, 2);
  EXPECT_EQ(part.piece_end(0), 20u);
  CheckPartition({10, 10, 10}, 2);
}

TEST(StepPartitionTest, MoreWorkersThanElements) {
  const StepPartition part(std::vector<size_t>{5}, 8);
  int non_empty = 0;
  for (int w = 0; w < 8; ++w) non_empty += part.segments(w).empty() ? 0 : 1;
  EXPECT_EQ(non_empty, 1);
  CheckPartition({5}, 8);
  CheckPartition({3, 0, 2}, 16);
  CheckPartition({40}, 7);
}

TEST(StepPartitionTest, EmptyAndZeroSizeChunks) {
  const StepPartition none(std::vector<size_t>{}, 3);
  EXPECT_EQ(none.total(), 0u);
  for (int w = 0; w < 3; ++w) EXPECT_THAT(none.segments(w), IsEmpty());
  const StepPartition zeros(std::vector<size_t>{0, 0}, 2);
  EXPECT_THAT(zeros.segments(0), IsEmpty());
  EXPECT_THAT(zeros.segments(1), IsEmpty());
  CheckPartition({0, 33, 0, 0, 17, 0}, 3);
}

TEST(StepPartitionTest, LineMultipleChunksGiveGloballyAlignedBoundaries) {
  const std::vector<size_t> sizes(5, 4096);
  for (int workers = 1; workers <= 9; ++workers) {
    const StepPartition part(sizes, workers);
    for (int w = 0; w < workers; ++w) EXPECT_EQ(part.piece_end(w) % kStepAlignElems, 0u);
    CheckPartition(sizes, workers);
  }
}

TEST(StepPartitionTest, RandomChunkSizes) {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<size_t> sizes(1 + rng() % 8);
    for (size_t& s : sizes) s = (rng() % 4 == 0) ? 0 : rng() % (rng() % 2 ? 40 : 5000);
    CheckPartition(sizes, 1 + static_cast<int>(rng() % 9));
  }
}

TEST(FixedBlocksTest, CutsEachChunkIndependently) {
  EXPECT_THAT(FixedBlocks(std::vector<size_t>{5, 0, 8}, 4),
              ElementsAre(Segment{0, 0, 4}, Segment{0, 4, 5}, Segment{2, 0, 4}, Segment{2, 4, 8}));
  EXPECT_THAT(FixedBlocks(std::vector<size_t>{}, 4), IsEmpty());
}

}  // namespace
}  // namespace zo
