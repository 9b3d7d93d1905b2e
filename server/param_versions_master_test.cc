// ParamVersions serving versions from the job's fp32 master: the latest
// rounded as it is read, the one before undone from it (a delayed parameter
// update), skips and restores, and pulls racing updates.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/convert.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/error_detail.h"
#include "server/param_versions.h"
#include "server/param_versions_test_util.h"

namespace zo {
namespace {

using testing::AwaitBlocked;
using testing::BlockedUpdate;
using testing::FromMasterTest;
using ::testing::HasSubstr;
using testing::IsOk;
using testing::IsOkAndHolds;
using testing::kElems;
using testing::kFailedPrecondition;
using ::testing::Optional;
using testing::StatusIs;

TEST_F(FromMasterTest, TheLatestVersionIsTheRoundedMasterAndIsNotStored) {
  std::unique_ptr<ParamVersions> v = Make(/*keep_previous=*/false);
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(v->from_master());
  EXPECT_EQ(v->buffer_bytes(), 0);
  EXPECT_EQ(v->base_data(), nullptr);
  SetMaster(0);  // the initial weights, loaded into the master
  {
    ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease lease, v->Acquire(0));
    EXPECT_EQ(lease.data(), nullptr) << "no stored copy to point at";
    EXPECT_THAT(ReadsAs(lease), IsOkAndHolds(0));
    EXPECT_THAT(ReadsAs(lease, 7, 20), IsOkAndHolds(0));
  }
  Update(*v, 1);
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease lease, v->Acquire(1));
  EXPECT_THAT(ReadsAs(lease), IsOkAndHolds(1));
  EXPECT_THAT(v->Acquire(0), StatusIs(kFailedPrecondition,
                                      HasSubstr("version 0 is not held (latest is 1; only the "
                                                "newest version is kept)")));
  const absl::Status gone = v->Acquire(0).status();
  EXPECT_EQ(ReasonOf(gone), v1::ErrorDetail::VERSION_NOT_HELD);
  EXPECT_EQ(DetailOf(gone)->version(), 1);
}

// Without the previous version served an update waits for the pulls of the
// latest, which read the master it is about to write.
TEST_F(FromMasterTest, WithoutThePreviousVersionAnUpdateWaitsForThePullsOfTheLatest) {
  std::unique_ptr<ParamVersions> v = Make(/*keep_previous=*/false);
  ASSERT_NE(v, nullptr);
  SetMaster(0);
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease first, v->Acquire(0));
  std::optional<ParamVersions::Lease> pull(std::move(first));
  BlockedUpdate step(*v);
  EXPECT_FALSE(step.began);
  EXPECT_THAT(ReadsAs(*pull, 32, 32), IsOkAndHolds(0)) << "the pull goes on meanwhile";
  // A pull begun now (a worker that died after its last push) does not
  // hold the update off: it reads until the update begins.
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease late, v->Acquire(0));
  EXPECT_THAT(ReadsAs(late, 0, 8), IsOkAndHolds(0));
  pull.reset();
  step.Join();
  EXPECT_TRUE(step.began);
  EXPECT_THAT(ReadsAs(late, 8, 8), StatusIs(kFailedPrecondition, HasSubstr("not held")));
  EXPECT_THAT(v->Acquire(0), StatusIs(kFailedPrecondition, HasSubstr("not held")))
      << "the master is being written";
  SetMaster(1);
  v->CommitWrite(1);
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease lease, v->Acquire(1));
  EXPECT_THAT(ReadsAs(lease), IsOkAndHolds(1));
}

// With DPU the version before the latest is served too, without a copy:
// each update checks the undo against each tile's old weights and keeps
// only the corrections, so a pull of the latest that is still going on
// reads the same bytes through the update, and the update does not wait.
TEST_F(FromMasterTest, ThePreviousVersionIsUndoneSoAPullOfTheLatestGoesOnThroughTheUpdate) {
  std::unique_ptr<ParamVersions> v = Make(/*keep_previous=*/true);
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->buffer_bytes(), 0);
  SetMaster(0);
  Update(*v, 1);
  // Elements 0, 5, ..., 60 the undo gets wrong: 13 corrections of 4 + 2 bytes.
  EXPECT_EQ(v->corrections().elems, 13);
  EXPECT_EQ(v->corrections().bytes, 13 * 6);
  EXPECT_EQ(v->buffer_bytes(), 13 * 6);
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v0, v->Acquire(0));
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v1, v->Acquire(1));
  EXPECT_EQ(v0.data(), nullptr) << "no stored copy";
  EXPECT_THAT(ReadsAs(v0), IsOkAndHolds(0));
  EXPECT_THAT(ReadsAs(v0, 3, 29), IsOkAndHolds(0));
  EXPECT_THAT(ReadsAs(v1, 0, 10), IsOkAndHolds(1));
  {
    // v0 is pinned (a checkpoint writing it): the next update waits for it.
    std::optional<ParamVersions::Lease> old(std::move(v0));
    BlockedUpdate step(*v, UndoOf(1, 2));
    EXPECT_FALSE(step.began);
    old.reset();
    EXPECT_EQ(step.Join(), nullptr);
  }
  // Mid-update: version 1 is now undone from the new master.
  for (int64_t offset = 0; offset < kElems; offset += kTile) UpdateRange(*v, 2, offset, kTile);
  EXPECT_THAT(ReadsAs(v1, 10, kElems - 10), IsOkAndHolds(1)) << "the rest of the pull";
  CommitUpdate(*v, 2);
  EXPECT_THAT(ReadsAs(v1), IsOkAndHolds(1));
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v2, v->Acquire(2));
  EXPECT_THAT(ReadsAs(v2), IsOkAndHolds(2));
  EXPECT_THAT(v->Acquire(0), StatusIs(kFailedPrecondition, HasSubstr("two newest")));

  // The v1 lease, unpinned, does not hold up the next update either; after
  // it v1 is gone and the lease says so.
  Update(*v, 3);
  EXPECT_THAT(ReadsAs(v1), StatusIs(kFailedPrecondition, HasSubstr("version 1 is not held")));
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease again, v->Acquire(2));
  EXPECT_THAT(ReadsAs(again), IsOkAndHolds(2));
}

// Where the undo gets most of a range wrong, corrections would outweigh a
// copy: the range is kept whole instead, and so is every range of an update
// that brings no undo. Memory never exceeds a copy's.
TEST_F(FromMasterTest, ARangeTheUndoGetsMostlyWrongIsKeptWhole) {
  std::unique_ptr<ParamVersions> v = Make(/*keep_previous=*/true);
  ASSERT_NE(v, nullptr);
  SetMaster(0);
  wrong_every_ = 2;  // 8 of a tile's 16: past the 5 that cost less than a copy
  Update(*v, 1);
  EXPECT_EQ(v->corrections().elems, kElems);
  EXPECT_EQ(v->corrections().bytes, kElems * 2);
  {
    ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v0, v->Acquire(0));
    EXPECT_THAT(ReadsAs(v0), IsOkAndHolds(0));
    EXPECT_THAT(ReadsAs(v0, 9, 30), IsOkAndHolds(0));
  }  // pinned: the next update would wait for it

  wrong_every_ = 5;
  EXPECT_EQ(v->BeginWrite(nullptr), nullptr);
  for (int64_t offset = 0; offset < kElems; offset += kTile) UpdateRange(*v, 2, offset, kTile);
  CommitUpdate(*v, 2);
  EXPECT_EQ(v->corrections().bytes, kElems * 2);
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v1, v->Acquire(1));
  EXPECT_THAT(ReadsAs(v1), IsOkAndHolds(1));
}

// The update makes the latest version undoable range by range as it goes.
// A piece of it read meanwhile is undone where its range is done, read from
// the master where the update has not claimed it yet, and waits for the
// update where it is writing it.
TEST_F(FromMasterTest, APieceTheUpdateHasNotReachedIsReadFromTheMasterWithoutWaiting) {
  std::unique_ptr<ParamVersions> v = Make(/*keep_previous=*/true);
  ASSERT_NE(v, nullptr);
  SetMaster(0);
  Update(*v, 1);
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v1, v->Acquire(1));
  BeginUpdate(*v, 2);
  UpdateRange(*v, 2, 0, kTile);
  EXPECT_THAT(ReadsAs(v1, 0, kTile), IsOkAndHolds(1)) << "kept";
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease late, v->Acquire(1));
  EXPECT_EQ(late.data(), nullptr) << "a lease taken mid-update reads range by range";
  const int64_t blocks = v->times_blocked();
  EXPECT_THAT(ReadsAs(late, kTile, kElems - kTile), IsOkAndHolds(1)) << "ahead of the update";
  EXPECT_EQ(v->times_blocked(), blocks) << "without waiting for it";
  // A range the update has claimed is being written: its read waits until
  // the update has kept all of it.
  v->ClaimRange(kTile, kTile);
  BlockedRead rest(*v, late, kTile, 2 * kTile);
  UpdateRange(*v, 2, kTile, kTile);  // half of what the reader needs
  EXPECT_FALSE(rest.done);
  UpdateRange(*v, 2, 2 * kTile, kTile);
  EXPECT_THAT(rest.Join(), IsOkAndHolds(1));
  UpdateRange(*v, 2, 3 * kTile, kElems - 3 * kTile);
  CommitUpdate(*v, 2);
  EXPECT_THAT(ReadsAs(v1), IsOkAndHolds(1));
  EXPECT_THAT(ReadsAs(late), IsOkAndHolds(1));
}

// The update claims a tile before writing it: a read that took the tile
// from the master ahead of the update holds the claim off until it ends,
// and reads the old weights whole.
TEST_F(FromMasterTest, AnUpdateWaitsToClaimATileAReadAheadIsReading) {
  std::unique_ptr<ParamVersions> v = Make(/*keep_previous=*/true);
  ASSERT_NE(v, nullptr);
  SetMaster(0);
  Update(*v, 1);
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v1, v->Acquire(1));
  BeginUpdate(*v, 2);
  std::atomic<bool> hold{true}, reading{false}, release{false};
  while_reading_master_ = [&] {
    if (!hold.exchange(false)) return;  // the first read only
    reading = true;
    while (!release) std::this_thread::yield();
  };
  absl::StatusOr<int> ahead = -2;
  std::thread reader([&] { ahead = ReadsAs(v1, kTile, 2 * kTile); });
  while (!reading) std::this_thread::yield();
  const int64_t blocks = v->times_blocked();
  std::atomic<bool> claimed{false};
  std::thread update([&] {
    UpdateRange(*v, 2, 0, kTile);  // outside the read: not held off
    UpdateRange(*v, 2, 2 * kTile, kTile);
    claimed = true;
  });
  AwaitBlocked(*v, blocks + 1);
  EXPECT_FALSE(claimed) << "the claim of a tile being read waits";
  release = true;
  reader.join();
  update.join();
  EXPECT_THAT(ahead, IsOkAndHolds(1));
  UpdateRange(*v, 2, kTile, kTile);
  UpdateRange(*v, 2, 3 * kTile, kElems - 3 * kTile);
  CommitUpdate(*v, 2);
  EXPECT_THAT(ReadsAs(v1), IsOkAndHolds(1));
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v2, v->Acquire(2));
  EXPECT_THAT(ReadsAs(v2), IsOkAndHolds(2));
}

// An update that fails part way (the step's state went bad) ends the
// keeping: a read waiting for a range is told the version is gone, not left
// waiting, and a later update keeps afresh.
TEST_F(FromMasterTest, AFailedUpdateReleasesTheReadsWaitingForItsRanges) {
  std::unique_ptr<ParamVersions> v = Make(/*keep_previous=*/true);
  ASSERT_NE(v, nullptr);
  SetMaster(0);
  Update(*v, 1);
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v1, v->Acquire(1));
  BeginUpdate(*v, 2);
  UpdateRange(*v, 2, 0, kTile);
  v->ClaimRange(kTile, kTile);  // being written
  BlockedRead rest(*v, v1, kTile, kTile);
  v->AbortWrite();
  EXPECT_THAT(rest.Join(), StatusIs(kFailedPrecondition, HasSubstr("version 1 is not held")));
  EXPECT_EQ(v->corrections().bytes, 0) << "the partial update's corrections are dropped";

  // Wholly kept before the failure: the version is still served.
  ASSERT_THAT(v->Reset(4), IsOk());
  SetMaster(4);
  v->CommitBase();
  BeginUpdate(*v, 5);
  UpdateRange(*v, 5, 0, kElems);
  v->AbortWrite();
  EXPECT_THAT(ReadsAs(*v->Acquire(4)), IsOkAndHolds(4));
}

TEST_F(FromMasterTest, SkipsShareDataAndARestoreStartsFromTheMaster) {
  std::unique_ptr<ParamVersions> v = Make(/*keep_previous=*/true);
  ASSERT_NE(v, nullptr);
  SetMaster(0);
  Update(*v, 1);
  v->RecordSkip(2);
  EXPECT_THAT(v->DataVersion(2), Optional(1));
  {
    ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease lease, v->Acquire(2));
    EXPECT_THAT(ReadsAs(lease), IsOkAndHolds(1));
  }
  Update(*v, 3);  // keeps the data of versions 1 and 2
  for (int64_t version : {1, 2}) {
    ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease lease, v->Acquire(version));
    EXPECT_THAT(ReadsAs(lease), IsOkAndHolds(1)) << version;
  }

  ASSERT_THAT(v->Reset(5), IsOk());
  EXPECT_THAT(v->Acquire(5), StatusIs(kFailedPrecondition, HasSubstr("not held")))
      << "until CommitBase";
  SetMaster(5);  // the checkpoint, loaded into the master
  v->CommitBase();
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease lease, v->Acquire(5));
  EXPECT_THAT(ReadsAs(lease), IsOkAndHolds(5));
  EXPECT_THAT(v->Acquire(3), StatusIs(kFailedPrecondition, HasSubstr("not held")));
}

// A restore with the previous version: the checkpoint's copy goes into a
// buffer that lives until CommitBase, which undoes the restored step and
// keeps only the corrections; the first update replaces them.
TEST_F(FromMasterTest, ARestoreWithThePreviousVersionKeepsOnlyItsCorrections) {
  for (bool with_undo : {true, false}) {
    SCOPED_TRACE(with_undo ? "undo" : "no undo: copies");
    std::unique_ptr<ParamVersions> v = Make(/*keep_previous=*/true);
    ASSERT_NE(v, nullptr);
    SetMaster(0);
    Update(*v, 1);
    ASSERT_THAT(v->Reset(8, ParamVersions::Previous::kStored), IsOk());
    ASSERT_NE(v->previous_data(), nullptr);
    EXPECT_EQ(v->buffer_bytes(), kElems * 2) << "the stored copy, until CommitBase";
    SetMaster(7);  // what version 7 rounds to, as the checkpoint stored it
    FloatToHalf(master_.data(), static_cast<uint16_t*>(v->previous_data()), kElems);
    SetMaster(8);  // the checkpoint's master
    v->CommitBase(with_undo ? UndoOf(7, 8) : nullptr);
    EXPECT_EQ(v->previous_data(), nullptr);
    EXPECT_EQ(v->buffer_bytes(), with_undo ? 13 * 6 : kElems * 2);
    {
      ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v7, v->Acquire(7));
      EXPECT_EQ(v7.data(), nullptr);
      EXPECT_THAT(ReadsAs(v7), IsOkAndHolds(7));
      ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v8, v->Acquire(8));
      EXPECT_THAT(ReadsAs(v8), IsOkAndHolds(8));
    }
    Update(*v, 9);
    EXPECT_THAT(v->Acquire(7), StatusIs(kFailedPrecondition, HasSubstr("not held")));
    ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v8, v->Acquire(8));
    EXPECT_THAT(ReadsAs(v8), IsOkAndHolds(8));
  }

  // Without keep_previous there is nowhere to put one: the restore holds
  // only its own version.
  std::unique_ptr<ParamVersions> plain = Make(/*keep_previous=*/false);
  ASSERT_NE(plain, nullptr);
  ASSERT_THAT(plain->Reset(8, ParamVersions::Previous::kStored), IsOk());
  EXPECT_EQ(plain->previous_data(), nullptr);
  plain->CommitBase();
  EXPECT_EQ(plain->DataVersion(7), std::nullopt);
}

// Pulls racing the updates: every piece a pull gets is wholly the version it
// asked for, rounded or undone from the master, or read as the update wrote
// it, or the pull is told the version is gone; never a mix of two versions.
TEST_F(FromMasterTest, PiecesReadDuringUpdatesAreNeverAMix) {
  for (bool keep_previous : {false, true}) {
    std::unique_ptr<ParamVersions> v = Make(keep_previous);
    ASSERT_NE(v, nullptr);
    SetMaster(0);
    std::atomic<bool> done{false};
    std::atomic<int64_t> pieces{0};
    std::atomic<int64_t> mixed{0};
    std::vector<std::thread> pullers;
    // The latest, the one before, and the one being written (if any).
    for (int t = -1; t < 2; ++t) {
      pullers.emplace_back([&, t] {
        while (!done) {
          const int64_t version = std::max<int64_t>(0, v->latest() - t);
          absl::StatusOr<ParamVersions::Lease> lease = v->Acquire(version);
          if (!lease.ok()) continue;  // replaced (or not begun) since latest() was read
          for (int64_t offset = 0; offset < kElems; offset += 16) {
            absl::StatusOr<int> as = ReadsAs(*lease, offset, 16);
            if (!as.ok()) break;  // gone: the pull ends
            ++pieces;
            if (*as != version) ++mixed;
          }
        }
      });
    }
    for (int version = 1; version <= 9; ++version) {
      // Wait for a few pieces per version, so that reads overlap updates.
      const int64_t until = pieces + 8;
      while (pieces < until) std::this_thread::yield();
      Update(*v, version);
    }
    done = true;
    for (std::thread& t : pullers) t.join();
    EXPECT_EQ(mixed, 0) << (keep_previous ? "previous served" : "latest only");
    EXPECT_GT(pieces, 0);
  }
}

}  // namespace
}  // namespace zo
