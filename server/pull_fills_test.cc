#include "server/pull_fills.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

constexpr int64_t kTile = 8;
constexpr int64_t kElems = 64;  // 8 tiles of a server's local elements

// Element i of version v, as a 16-bit value that names both.
uint16_t Value(int64_t version, int64_t i) { return static_cast<uint16_t>(version * 1000 + i); }

// An update of `version` as the job runs one: tile by tile, each filled
// after it is done (`done` says which are, as ParamVersions would).
class Update {
 public:
  Update(PullFills& fills, int64_t version) : fills_(fills), version_(version) {}
  void Begin(bool ahead_holds = false) { fills_.BeginUpdate(version_, ahead_holds); }
  void Tile(int64_t tile) {
    done_.Add(tile * kTile, (tile + 1) * kTile);
    fills_.Fill(tile * kTile, kTile, [&](int64_t from, int64_t n, std::byte* dst) {
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t v = Value(version_, from + i);
        std::memcpy(dst + i * 2, &v, 2);
      }
    });
  }
  void End(bool whole) { fills_.EndUpdate(version_, whole); }
  RangeSet done() const { return done_; }

 private:
  PullFills& fills_;
  const int64_t version_;
  RangeSet done_;
};

// A speculation of `version` writing [begin, end) ahead, with values that
// name `marker` instead of the version: a test can tell them from the
// update's own.
void FillAhead(PullFills& fills, int64_t version, int64_t marker, int64_t begin, int64_t end) {
  fills.FillAhead(version, begin, end - begin, [&](int64_t from, int64_t n, std::byte* dst) {
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t v = Value(marker, from + i);
      std::memcpy(dst + i * 2, &v, 2);
    }
  });
}

// A puller's destination for local elements [begin, end), in pieces that
// cross tile boundaries, in a buffer of its own (0xffff: not written).
struct Destination {
  Destination(int64_t begin, int64_t end) : begin(begin), data(end - begin, 0xffff) {}
  std::vector<PullFills::Copy> Copies(int64_t piece) {
    std::vector<PullFills::Copy> copies;
    for (int64_t at = 0; at < static_cast<int64_t>(data.size()); at += piece) {
      const int64_t n = std::min<int64_t>(piece, static_cast<int64_t>(data.size()) - at);
      copies.push_back({begin + at, n, reinterpret_cast<std::byte*>(data.data() + at)});
    }
    std::reverse(copies.begin(), copies.end());  // any order
    return copies;
  }
  // Elements that hold `version`'s value, counted.
  int64_t Holding(int64_t version) const {
    int64_t n = 0;
    for (size_t i = 0; i < data.size(); ++i) n += data[i] == Value(version, begin + i);
    return n;
  }
  int64_t begin;
  std::vector<uint16_t> data;
};

TEST(PullFillsTest, AnUpdateBegunAfterTheRegistrationWritesEveryRange) {
  PullFills fills(2);
  Destination dst(3, 61);  // not tile-aligned at either end
  const PullFills::Id id = fills.Register(2, dst.Copies(5), nullptr);
  ASSERT_NE(id, 0u);
  Update update(fills, 2);
  update.Begin();
  for (int64_t t : {3, 0, 7, 1, 2, 6, 4, 5}) update.Tile(t);  // workers finish in any order
  update.End(/*whole=*/true);
  EXPECT_THAT(fills.Take(id), testing::Optional(int64_t{58 * 2}));
  EXPECT_EQ(dst.Holding(2), 58);
  EXPECT_EQ(fills.size(), 0);
}

TEST(PullFillsTest, AnotherVersionsUpdateWritesNothing) {
  PullFills fills(2);
  Destination dst(0, kElems);
  const PullFills::Id id = fills.Register(3, dst.Copies(16), nullptr);
  Update update(fills, 2);
  update.Begin();
  for (int64_t t = 0; t < 8; ++t) update.Tile(t);
  update.End(true);
  EXPECT_EQ(dst.Holding(2), 0);
  EXPECT_EQ(fills.Take(id), std::nullopt) << "version 3 was skipped, say";
}

TEST(PullFillsTest, AFailedUpdateLeavesTheRegistrationUnfilled) {
  PullFills fills(2);
  Destination dst(0, kElems);
  const PullFills::Id id = fills.Register(2, dst.Copies(16), nullptr);
  Update update(fills, 2);
  update.Begin();
  update.Tile(0);
  update.End(/*whole=*/false);
  EXPECT_EQ(fills.Take(id), std::nullopt);
}

// Registered while the update runs: the tiles it had done are the puller's
// to read (ReadDoneBefore), never written by a later Fill of theirs; every
// tile done after is filled.
TEST(PullFillsTest, ARegistrationMidUpdateLeavesTheTilesAlreadyDoneToThePuller) {
  PullFills fills(2);
  Update update(fills, 5);
  update.Begin();
  update.Tile(0);
  update.Tile(2);
  Destination dst(4, 60);
  const PullFills::Id id = fills.Register(5, dst.Copies(7), [&] { return update.done(); });
  ASSERT_NE(id, 0u);
  // A worker that marked tile 2 done before the registration fills it after.
  update.Tile(2);
  EXPECT_EQ(dst.Holding(5), 0) << "tiles 0 and 2 were done before it registered";
  int64_t read = 0;
  ASSERT_TRUE(fills
                  .ReadDoneBefore(id,
                                  [&](int64_t from, int64_t n, std::byte* out) {
                                    for (int64_t i = 0; i < n; ++i) {
                                      const uint16_t v = Value(5, from + i);
                                      std::memcpy(out + i * 2, &v, 2);
                                    }
                                    read += n;
                                    return absl::OkStatus();
                                  })
                  .ok());
  EXPECT_EQ(read, 4 + 8) << "[4, 8) of tile 0 and all of tile 2";
  for (int64_t t : {1, 3, 4, 5, 6, 7}) update.Tile(t);
  update.End(true);
  EXPECT_THAT(fills.Take(id), testing::Optional(int64_t{56 * 2}));
  EXPECT_EQ(dst.Holding(5), 56);
}

TEST(PullFillsTest, ARegistrationAfterTheUpdateEndedIsRefused) {
  PullFills fills(2);
  Update update(fills, 5);
  update.Begin();
  for (int64_t t = 0; t < 8; ++t) update.Tile(t);
  update.End(true);
  Destination dst(0, kElems);
  EXPECT_EQ(fills.Register(5, dst.Copies(16), [&] { return update.done(); }), 0u);
  EXPECT_EQ(fills.size(), 0);
}

// Take on a thread of its own, as a puller waits while the update runs.
class BackgroundTake {
 public:
  BackgroundTake(PullFills& fills, PullFills::Id id)
      : thread_([this, &fills, id] {
          bytes_ = fills.Take(id);
          taken_ = true;
        }) {}
  ~BackgroundTake() {
    if (thread_.joinable()) thread_.join();
  }
  bool taken() const { return taken_; }
  // Waits for Take to return; its bytes.
  std::optional<int64_t> Join() {
    thread_.join();
    return bytes_;
  }

 private:
  std::atomic<bool> taken_{false};
  std::optional<int64_t> bytes_;
  std::thread thread_;  // last: starts once the rest is made
};

TEST(PullFillsTest, TakeWaitsForTheUpdateToEnd) {
  PullFills fills(2);
  Destination dst(0, 16);  // tiles 0 and 1 only
  const PullFills::Id id = fills.Register(1, dst.Copies(16), nullptr);
  Update update(fills, 1);
  update.Begin();
  update.Tile(0);
  BackgroundTake puller(fills, id);
  for (int64_t t = 1; t < 8; ++t) update.Tile(t);
  EXPECT_FALSE(puller.taken()) << "the update has not ended, though its ranges are written";
  update.End(true);
  EXPECT_THAT(puller.Join(), testing::Optional(int64_t{16 * 2}));
  EXPECT_EQ(dst.Holding(1), 16);
}

// Registered early, Take answers once every range of the registration is
// written, before the rest of the version: a puller of the first layers'
// tensors has them while the update still writes the last ones.
TEST(PullFillsTest, TakeOfAnEarlyRegistrationWaitsForItsRangesOnly) {
  PullFills fills(2);
  Destination dst(4, 28);  // tiles 0 to 3, the first and last in part
  const PullFills::Id id = fills.Register(1, dst.Copies(5), nullptr, /*early=*/true);
  Update update(fills, 1);
  update.Begin();
  for (int64_t t : {7, 3, 0, 2}) update.Tile(t);
  BackgroundTake puller(fills, id);
  update.Tile(5);
  EXPECT_FALSE(puller.taken()) << "tile 1 is not written";
  update.Tile(1);
  EXPECT_THAT(puller.Join(), testing::Optional(int64_t{24 * 2}));
  EXPECT_EQ(dst.Holding(1), 24);
  EXPECT_EQ(fills.size(), 0);
  update.Tile(4);
  update.Tile(6);
  update.End(true);
  EXPECT_EQ(dst.Holding(1), 24) << "nothing written after it was taken";
}

TEST(PullFillsTest, TakeOfAnEarlyRegistrationOfAWholeVersionWaitsForItsLastTile) {
  PullFills fills(2);
  Destination dst(0, kElems);
  const PullFills::Id id = fills.Register(1, dst.Copies(16), nullptr, /*early=*/true);
  Update update(fills, 1);
  update.Begin();
  update.Tile(0);
  BackgroundTake puller(fills, id);
  for (int64_t t = 1; t < 7; ++t) update.Tile(t);
  EXPECT_FALSE(puller.taken()) << "tile 7 is not written";
  update.Tile(7);
  EXPECT_THAT(puller.Join(), testing::Optional(int64_t{kElems * 2}));
  EXPECT_EQ(dst.Holding(1), kElems);
  update.End(true);
}

// An early registration taken whole before its update failed holds the
// decided step's weights; one not yet taken is told it was not filled.
TEST(PullFillsTest, AnUpdateThatFailsAfterARegistrationWasWholeLeavesItUnfilledUntilTaken) {
  PullFills fills(2);
  Destination first(0, 16), last(48, 64);
  const PullFills::Id a = fills.Register(1, first.Copies(16), nullptr, /*early=*/true);
  const PullFills::Id b = fills.Register(1, last.Copies(16), nullptr, /*early=*/true);
  Update update(fills, 1);
  update.Begin();
  update.Tile(0);
  update.Tile(1);
  EXPECT_THAT(fills.Take(a), testing::Optional(int64_t{16 * 2}));
  update.Tile(6);
  update.Tile(7);
  update.End(/*whole=*/false);
  EXPECT_EQ(fills.Take(b), std::nullopt);
}

TEST(PullFillsTest, AWithdrawnRegistrationIsNotWrittenAgain) {
  PullFills fills(2);
  Destination dst(0, kElems);
  const PullFills::Id id = fills.Register(1, dst.Copies(16), nullptr);
  Update update(fills, 1);
  update.Begin();
  update.Tile(0);
  fills.Withdraw(id);  // the puller's wait was cancelled
  for (int64_t t = 1; t < 8; ++t) update.Tile(t);
  update.End(true);
  EXPECT_EQ(dst.Holding(1), kTile) << "only the tile filled before";
  EXPECT_EQ(fills.Take(id), std::nullopt);
  EXPECT_EQ(fills.size(), 0);
}

TEST(PullFillsTest, AKeptSpeculationsRangesAreNotWrittenAgain) {
  PullFills fills(2);
  Destination dst(3, 61);
  const PullFills::Id id = fills.Register(2, dst.Copies(5), nullptr);
  // Chunks of 12 elements: their edges cut tiles 1, 2 and 4 in two.
  FillAhead(fills, 2, /*marker=*/7, 0, 12);
  FillAhead(fills, 2, 7, 24, 36);
  EXPECT_EQ(dst.Holding(7), 9 + 12);
  Update update(fills, 2);
  update.Begin(/*ahead_holds=*/true);
  for (int64_t t = 0; t < 8; ++t) update.Tile(t);
  update.End(true);
  EXPECT_THAT(fills.Take(id), testing::Optional(int64_t{58 * 2}));
  EXPECT_EQ(dst.Holding(7), 9 + 12) << "written ahead: left alone";
  EXPECT_EQ(dst.Holding(2), 58 - 21) << "the rest, tiles cut by a chunk's edge too";
}

// The update that keeps a speculation counts what it wrote ahead as
// written, and what it writes ahead after it began too (the chunks left
// when the step was decided): a registration all written ahead is answered
// without a tile of the update's own.
TEST(PullFillsTest, AKeptSpeculationAnswersTheRangesItWroteAhead) {
  PullFills fills(2);
  Destination first(0, 20), rest(20, kElems);
  const PullFills::Id a = fills.Register(2, first.Copies(16), nullptr, /*early=*/true);
  const PullFills::Id b = fills.Register(2, rest.Copies(16), nullptr, /*early=*/true);
  FillAhead(fills, 2, /*marker=*/7, 40, 64);  // the last layers, during the backward
  Update update(fills, 2);
  update.Begin(/*ahead_holds=*/true);
  FillAhead(fills, 2, 7, 0, 24);  // the first, once decided
  EXPECT_THAT(fills.Take(a), testing::Optional(int64_t{20 * 2}));
  EXPECT_EQ(first.Holding(7), 20);
  FillAhead(fills, 2, 7, 24, 40);
  EXPECT_THAT(fills.Take(b), testing::Optional(int64_t{44 * 2}));
  EXPECT_EQ(rest.Holding(7), 44);
  for (int64_t t = 0; t < 8; ++t) update.Tile(t);
  update.End(true);
  EXPECT_EQ(first.Holding(7) + rest.Holding(7), kElems) << "not written again";
}

// Written ahead after an update began that does not keep the speculation,
// or for another version's: not the registration's weights.
TEST(PullFillsTest, WritesAheadIntoAnUpdateThatDropsTheSpeculationAreNotItsWeights) {
  PullFills fills(2);
  Destination dst(0, kElems);
  const PullFills::Id id = fills.Register(2, dst.Copies(16), nullptr, /*early=*/true);
  Update update(fills, 2);
  update.Begin(/*ahead_holds=*/false);
  FillAhead(fills, 2, 7, 0, kElems);
  FillAhead(fills, 3, 8, 0, kElems);
  EXPECT_EQ(dst.Holding(7) + dst.Holding(8), 0);
  for (int64_t t = 0; t < 8; ++t) update.Tile(t);
  EXPECT_THAT(fills.Take(id), testing::Optional(int64_t{kElems * 2}));
  EXPECT_EQ(dst.Holding(2), kElems);
  update.End(true);
}

TEST(PullFillsTest, ADroppedSpeculationIsWrittenAgain) {
  PullFills fills(2);
  Destination dst(0, kElems);
  const PullFills::Id id = fills.Register(2, dst.Copies(16), nullptr);
  FillAhead(fills, 2, 7, 0, 40);
  Update update(fills, 2);
  update.Begin(/*ahead_holds=*/false);  // the step was clipped, say
  for (int64_t t = 0; t < 8; ++t) update.Tile(t);
  update.End(true);
  EXPECT_THAT(fills.Take(id), testing::Optional(int64_t{kElems * 2}));
  EXPECT_EQ(dst.Holding(2), kElems);
}

// No update fills the registration (the step is skipped, or its update
// fails): Take names every part a speculation wrote, forgotten ones too,
// for the puller to read again.
TEST(PullFillsTest, AnUnfilledRegistrationSaysWhatWasWrittenAhead) {
  for (const bool fails : {false, true}) {
    SCOPED_TRACE(fails ? "a failed update" : "a skipped step");
    PullFills fills(2);
    Destination dst(3, 61);
    const PullFills::Id id = fills.Register(2, dst.Copies(5), nullptr);
    FillAhead(fills, 2, 7, 0, 12);
    fills.ForgetAhead();  // a restore dropped it; the next speculation begins
    FillAhead(fills, 2, 8, 24, 36);
    FillAhead(fills, 3, 9, 40, 64);  // another version's: not into these places
    if (fails) {
      Update update(fills, 2);
      update.Begin(/*ahead_holds=*/false);
      update.Tile(0);
      update.End(/*whole=*/false);
    }
    std::vector<PullFills::Copy> written;
    EXPECT_EQ(fills.Take(id, &written), std::nullopt);
    // Per copy, in the order of the local elements; the places begin at 3.
    RangeSet said;
    int64_t last_end = 0;
    for (const PullFills::Copy& c : written) {
      EXPECT_GE(c.local_offset, last_end);
      last_end = c.local_offset + c.n;
      said.Add(c.local_offset, c.local_offset + c.n);
      EXPECT_EQ(c.dst, reinterpret_cast<std::byte*>(dst.data.data() + (c.local_offset - 3)));
    }
    EXPECT_EQ(said.size(), 9 + 12);
    EXPECT_TRUE(said.Contains(3, 12) && said.Contains(24, 36)) << "not the parts written ahead";
  }
}

TEST(PullFillsTest, ARegistrationAfterPartOfTheSpeculationGetsThatPartFromTheUpdate) {
  PullFills fills(2);
  Destination dst(0, kElems);
  FillAhead(fills, 2, 7, 0, 32);  // nobody registered yet
  const PullFills::Id id = fills.Register(2, dst.Copies(16), nullptr);
  FillAhead(fills, 2, 7, 32, 64);
  Update update(fills, 2);
  update.Begin(true);
  for (int64_t t = 0; t < 8; ++t) update.Tile(t);
  update.End(true);
  ASSERT_TRUE(fills.Take(id).has_value());
  EXPECT_EQ(dst.Holding(2), 32);
  EXPECT_EQ(dst.Holding(7), 32);
}

TEST(PullFillsTest, AnotherVersionsSpeculationOrAForgottenOneIsNotKept) {
  PullFills fills(2);
  Destination dst(0, kElems);
  const PullFills::Id id = fills.Register(2, dst.Copies(16), nullptr);
  FillAhead(fills, 3, 7, 0, 16);
  EXPECT_EQ(dst.Holding(7), 0) << "not the registration's version";
  FillAhead(fills, 2, 7, 16, 32);  // a step a restore dropped
  fills.ForgetAhead();             // the next speculation begins
  FillAhead(fills, 2, 8, 32, 48);
  Update update(fills, 2);
  update.Begin(true);
  for (int64_t t = 0; t < 8; ++t) update.Tile(t);
  update.End(true);
  ASSERT_TRUE(fills.Take(id).has_value());
  EXPECT_EQ(dst.Holding(7), 0) << "forgotten: written again";
  EXPECT_EQ(dst.Holding(8), 16);
  EXPECT_EQ(dst.Holding(2), 48);
}

}  // namespace
}  // namespace zo
