#include "common/sharding.h"

#include <random>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::StatusIs;

std::vector<TensorSpec> Specs(const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    specs.push_back({"t" + std::to_string(i), shapes[i], DType::kFloat16});
  }
  return specs;
}

// Checks the invariants every map must satisfy, by counting ownership of each
// element of the flat space independently of how the map computes it.
void CheckInvariants(const ShardMap& map) {
  const int64_t total = map.total_elems();
  std::vector<int> owner_count(total, 0);
  std::vector<int> owner(total, -1);
  for (int s = 0; s < map.num_servers(); ++s) {
    int64_t owned = 0;
    for (int64_t c : map.ChunksOfServer(s)) {
      const FlatRange r = map.ChunkRange(c);
      for (int64_t i = r.begin; i < r.end; ++i) {
        ++owner_count[i];
        owner[i] = s;
      }
      owned += r.size();
    }
    EXPECT_EQ(owned, map.ElemsOnServer(s));
  }
  for (int64_t i = 0; i < total; ++i) ASSERT_EQ(owner_count[i], 1) << "element " << i;

  // Each tensor's pieces tile it exactly, in order, and each piece points at
  // the right place of the right chunk on the right server.
  std::vector<int> covered(total, 0);
  for (int t = 0; t < static_cast<int>(map.tensors().size()); ++t) {
    const FlatRange tr = map.TensorRange(t);
    EXPECT_EQ(tr.size(), NumElements(map.tensors()[t].shape));
    int64_t next = 0;
    for (const TensorPiece& p : map.PiecesOfTensor(t)) {
      EXPECT_EQ(p.tensor, t);
      EXPECT_EQ(p.tensor_offset, next);
      EXPECT_GT(p.length, 0);
      const int64_t flat = tr.begin + p.tensor_offset;
      EXPECT_EQ(flat, map.ChunkRange(p.chunk).begin + p.chunk_offset);
      EXPECT_LE(p.chunk_offset + p.length, map.ChunkRange(p.chunk).size());
      for (int64_t i = flat; i < flat + p.length; ++i) {
        ++covered[i];
        EXPECT_EQ(owner[i], p.server);
      }
      next += p.length;
    }
    EXPECT_EQ(next, tr.size());
  }
  for (int64_t i = 0; i < total; ++i) ASSERT_EQ(covered[i], 1) << "element " << i;

  // A chunk's pieces are the same pieces seen from the chunk's side.
  for (int64_t c = 0; c < map.num_chunks(); ++c) {
    int64_t next = 0;
    for (const TensorPiece& p : map.PiecesOfChunk(c)) {
      EXPECT_EQ(p.chunk, c);
      EXPECT_EQ(p.chunk_offset, next);
      const auto of_tensor = map.PiecesOfTensor(p.tensor);
      EXPECT_THAT(of_tensor, ::testing::Contains(p));
      next += p.length;
    }
    EXPECT_EQ(next, map.ChunkRange(c).size());
  }

  // Balanced: no server owns more than one chunk beyond any other.
  int64_t lo = total, hi = 0;
  for (int s = 0; s < map.num_servers(); ++s) {
    lo = std::min(lo, map.ElemsOnServer(s));
    hi = std::max(hi, map.ElemsOnServer(s));
  }
  EXPECT_LE(hi - lo, map.chunk_elems());
}

TEST(ShardMapTest, SingleServerOwnsEverything) {
  ZO_ASSERT_OK_AND_ASSIGN(ShardMap map, ShardMap::Create(Specs({{3, 5}, {7}}), 4, 1));
  EXPECT_EQ(map.total_elems(), 22);
  EXPECT_EQ(map.num_chunks(), 6);
  EXPECT_THAT(map.ChunksOfServer(0), ElementsAre(0, 1, 2, 3, 4, 5));
  CheckInvariants(map);
}

TEST(ShardMapTest, TensorsSmallerThanAChunkShareIt) {
  ZO_ASSERT_OK_AND_ASSIGN(ShardMap map, ShardMap::Create(Specs({{2}, {3}, {}}), 100, 3));
  EXPECT_EQ(map.num_chunks(), 1);
  EXPECT_THAT(map.PiecesOfChunk(0),
              ElementsAre(TensorPiece{0, 0, 0, 0, 0, 2}, TensorPiece{1, 0, 0, 0, 2, 3},
                          TensorPiece{2, 0, 0, 0, 5, 1}));
  EXPECT_THAT(map.ChunksOfServer(1), ElementsAre());
  EXPECT_EQ(map.ElemsOnServer(2), 0);
  CheckInvariants(map);
}

TEST(ShardMapTest, ChunkBoundaryInsideATensor) {
  // t0 = 6 elements, t1 = 10: chunks of 4 cut t0 at 4 and t1 at 2, 6.
  ZO_ASSERT_OK_AND_ASSIGN(ShardMap map, ShardMap::Create(Specs({{2, 3}, {10}}), 4, 2));
  EXPECT_THAT(map.PiecesOfTensor(1),
              ElementsAre(TensorPiece{1, 1, 1, 0, 2, 2}, TensorPiece{1, 2, 0, 2, 0, 4},
                          TensorPiece{1, 3, 1, 6, 0, 4}));
  EXPECT_THAT(map.ChunksOfServer(0), ElementsAre(0, 2));
  EXPECT_THAT(map.ChunksOfServer(1), ElementsAre(1, 3));
  CheckInvariants(map);
}

TEST(ShardMapTest, LastChunkIsShort) {
  ZO_ASSERT_OK_AND_ASSIGN(ShardMap map, ShardMap::Create(Specs({{10}}), 4, 2));
  EXPECT_EQ(map.ChunkRange(2), (FlatRange{8, 10}));
  CheckInvariants(map);
}

TEST(ShardMapTest, EmptyTensorsOwnNothing) {
  ZO_ASSERT_OK_AND_ASSIGN(ShardMap map, ShardMap::Create(Specs({{4}, {0, 5}, {4}}), 4, 2));
  EXPECT_THAT(map.PiecesOfTensor(1), ElementsAre());
  EXPECT_THAT(map.PiecesOfChunk(1), ElementsAre(TensorPiece{2, 1, 1, 0, 0, 4}));
  CheckInvariants(map);
}

TEST(ShardMapTest, RandomManifestsKeepTheInvariants) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::vector<int64_t>> shapes;
    const int n = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < n; ++i) {
      std::vector<int64_t> shape;
      const int rank = static_cast<int>(rng() % 3);
      for (int d = 0; d < rank; ++d) shape.push_back(static_cast<int64_t>(rng() % 13));
      shapes.push_back(shape);
    }
    const int64_t chunk = 1 + static_cast<int64_t>(rng() % 17);
    const int servers = 1 + static_cast<int>(rng() % 5);
    ZO_ASSERT_OK_AND_ASSIGN(ShardMap map, ShardMap::Create(Specs(shapes), chunk, servers));
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    CheckInvariants(map);
  }
}

TEST(ShardMapTest, LargeManifestStaysBalanced) {
  // 13B-parameter scale: only the arithmetic, no per-element checks.
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 40; ++i) {
    specs.push_back({"layer" + std::to_string(i), {5120, 5120 * 12}, DType::kFloat16});
  }
  ZO_ASSERT_OK_AND_ASSIGN(ShardMap map, ShardMap::Create(specs, 4 << 20, 7));
  int64_t sum = 0;
  for (int s = 0; s < 7; ++s) sum += map.ElemsOnServer(s);
  EXPECT_EQ(sum, map.total_elems());
  EXPECT_EQ(map.total_elems(), int64_t{40} * 5120 * 5120 * 12);
}

TEST(ShardMapTest, SmallModelSpreadsOverEveryServer) {
  // 1M elements with the default 4 Mi chunks: without the cap one chunk,
  // all of it on server 0.
  const std::vector<TensorSpec> specs = {{"wte", {1000, 600}, DType::kFloat16},
                                         {"mlp", {400, 1000}, DType::kFloat16}};
  ZO_ASSERT_OK_AND_ASSIGN(ShardMap map, ShardMap::Create(specs, 4 << 20, 4));
  EXPECT_EQ(map.chunk_elems(), 253952);  // ceil(1e6 / 4) = 250000, up to 62 x 4096
  EXPECT_EQ(map.num_chunks(), 4);
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(map.ElemsOnServer(s), s < 3 ? 253952 : 1000000 - 3 * 253952) << "server " << s;
  }
  // A checkpoint records the chunk size in use; a map made from it is the same.
  ZO_ASSERT_OK_AND_ASSIGN(ShardMap again, ShardMap::Create(specs, map.chunk_elems(), 4));
  EXPECT_EQ(again.chunk_elems(), map.chunk_elems());
  // One server: one chunk, as before the cap.
  ZO_ASSERT_OK_AND_ASSIGN(ShardMap one, ShardMap::Create(specs, 4 << 20, 1));
  EXPECT_EQ(one.num_chunks(), 1);
}

TEST(ShardMapTest, ChunksAreNeverLargerThanAskedOrSmallerThanTheAlignment) {
  EXPECT_EQ(EffectiveChunkElems(1000000, 30000, 4), 30000);  // small enough already
  EXPECT_EQ(EffectiveChunkElems(1000, 4 << 20, 8), kChunkAlignElems);
  EXPECT_EQ(EffectiveChunkElems(0, 4 << 20, 2), kChunkAlignElems);
  EXPECT_EQ(EffectiveChunkElems(int64_t{13} << 30, 4 << 20, 16), 4 << 20);  // large: unchanged
  for (int64_t total : {1, 4095, 4097, 1 << 20, 12345678}) {
    for (int servers : {1, 2, 3, 7}) {
      const int64_t e = EffectiveChunkElems(total, 4 << 20, servers);
      EXPECT_EQ(EffectiveChunkElems(total, e, servers), e) << total << " over " << servers;
      // Every server holds a share once the model has S^2 aligned pieces
      // (below that, rounding up to the alignment may leave one out).
      if (total >= int64_t{servers} * servers * kChunkAlignElems) {
        EXPECT_GE((total + e - 1) / e, servers) << total << " over " << servers;
      }
    }
  }
}

TEST(ShardMapTest, TensorIndexByName) {
  ZO_ASSERT_OK_AND_ASSIGN(ShardMap map, ShardMap::Create(Specs({{1}, {2}}), 4, 1));
  ZO_ASSERT_OK_AND_ASSIGN(int index, map.TensorIndex("t1"));
  EXPECT_EQ(index, 1);
  EXPECT_THAT(map.TensorIndex("nope"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
}

TEST(ShardMapTest, RejectsBadInput) {
  EXPECT_THAT(ShardMap::Create(Specs({{1}}), 0, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("chunk_elems")));
  EXPECT_THAT(ShardMap::Create(Specs({{1}}), 4, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("servers")));
  EXPECT_THAT(ShardMap::Create(Specs({{3, -1}}), 4, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative dimension -1")));
  std::vector<TensorSpec> dup = {{"w", {1}}, {"w", {2}}};
  EXPECT_THAT(ShardMap::Create(dup, 4, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'w' appears twice")));
  std::vector<TensorSpec> unnamed = {{"", {1}}};
  EXPECT_THAT(ShardMap::Create(unnamed, 4, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty name")));
  std::vector<TensorSpec> huge = {{"a", {int64_t{1} << 40, int64_t{1} << 40}}};
  EXPECT_THAT(ShardMap::Create(huge, 4, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too large")));
}

}  // namespace
}  // namespace zo
