// ParamVersions served from the master: reads of the version an update is
// still writing (the in-process route), range by range as the update goes.
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/param_versions.h"
#include "server/param_versions_test_util.h"

namespace zo {
namespace {

using testing::BlockedUpdate;
using testing::FromMasterTest;
using ::testing::HasSubstr;
using testing::IsOkAndHolds;
using testing::kElems;
using testing::kFailedPrecondition;
using testing::StatusIs;

// The in-process route pulls the version an update is writing while it
// writes it: each range reads as the new version once the update is done
// with it, and waits for the update before that; the reads go on through
// the commit. With or without a previous version served.
TEST_F(FromMasterTest, APullOfTheVersionBeingWrittenFollowsTheUpdate) {
  for (bool keep_previous : {false, true}) {
    SCOPED_TRACE(keep_previous ? "previous served" : "latest only");
    std::unique_ptr<ParamVersions> v = Make(keep_previous);
    ASSERT_NE(v, nullptr);
    SetMaster(0);
    Update(*v, 1);
    EXPECT_THAT(v->Acquire(2), StatusIs(kFailedPrecondition, HasSubstr("not held")))
        << "not being written yet";
    BeginUpdate(*v, 2);
    ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v2, v->Acquire(2));
    EXPECT_EQ(v2.data(), nullptr);
    UpdateRange(*v, 2, 0, kTile);
    EXPECT_THAT(ReadsAs(v2, 0, kTile), IsOkAndHolds(2)) << "done: the new weights";
    {
      BlockedRead rest(*v, v2, kTile, 2 * kTile);
      UpdateRange(*v, 2, kTile, kTile);  // half of what the reader needs
      EXPECT_FALSE(rest.done);
      UpdateRange(*v, 2, 2 * kTile, kTile);
      EXPECT_THAT(rest.Join(), IsOkAndHolds(2));
    }
    BlockedRead tail(*v, v2, kElems - kTile, kTile);
    UpdateRange(*v, 2, 3 * kTile, kElems - 3 * kTile);
    EXPECT_THAT(tail.Join(), IsOkAndHolds(2));
    CommitUpdate(*v, 2);
    EXPECT_THAT(ReadsAs(v2), IsOkAndHolds(2)) << "the same lease after the commit";
    if (keep_previous) {
      ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v1, v->Acquire(1));
      EXPECT_THAT(ReadsAs(v1), IsOkAndHolds(1)) << "the replaced version is still served";
    }
  }
}

// What a pull registered for the update to write leaves to itself: nothing
// before the update, the tiles done while it runs, everything once the
// version is committed (an update that ended before the registration looked).
TEST_F(FromMasterTest, DoneRangesAreNoneThenTheTilesDoneThenAll) {
  std::unique_ptr<ParamVersions> v = Make(/*keep_previous=*/false);
  ASSERT_NE(v, nullptr);
  SetMaster(0);
  EXPECT_EQ(v->DoneRanges(1).size(), 0);
  BeginUpdate(*v, 1);
  UpdateRange(*v, 1, kTile, kTile);
  const RangeSet during = v->DoneRanges(1);
  EXPECT_EQ(during.size(), kTile);
  EXPECT_TRUE(during.Contains(kTile, 2 * kTile));
  EXPECT_EQ(v->DoneRanges(2).size(), 0) << "another version";
  for (int64_t offset = 0; offset < kElems; offset += kTile) {
    if (offset != kTile) UpdateRange(*v, 1, offset, kTile);
  }
  CommitUpdate(*v, 1);
  EXPECT_EQ(v->DoneRanges(1).size(), kElems);
}

// A read waiting on the version being written is told it is gone when the
// update fails, and no lease on it can be had afterwards.
TEST_F(FromMasterTest, AFailedUpdateEndsThePullsOfTheVersionItWrote) {
  for (bool keep_previous : {false, true}) {
    SCOPED_TRACE(keep_previous ? "previous served" : "latest only");
    std::unique_ptr<ParamVersions> v = Make(keep_previous);
    ASSERT_NE(v, nullptr);
    SetMaster(0);
    Update(*v, 1);
    BeginUpdate(*v, 2);
    ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v2, v->Acquire(2));
    UpdateRange(*v, 2, 0, kTile);
    BlockedRead rest(*v, v2, kTile, kTile);
    v->AbortWrite();
    EXPECT_THAT(rest.Join(), StatusIs(kFailedPrecondition, HasSubstr("version 2 is not held")));
    EXPECT_THAT(ReadsAs(v2, 0, kTile), StatusIs(kFailedPrecondition, HasSubstr("not held")))
        << "even a range the update had done";
    EXPECT_THAT(v->Acquire(2), StatusIs(kFailedPrecondition, HasSubstr("not held")));
  }
}

// Without a previous version served, a lease on the version being written
// keeps the master as the latest's leases do: the next update waits for it.
TEST_F(FromMasterTest, APullOfTheVersionBeingWrittenHoldsTheNextUpdateOff) {
  std::unique_ptr<ParamVersions> v = Make(/*keep_previous=*/false);
  ASSERT_NE(v, nullptr);
  SetMaster(0);
  BeginUpdate(*v, 1);
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease first, v->Acquire(1));
  std::optional<ParamVersions::Lease> pull(std::move(first));
  for (int64_t offset = 0; offset < kElems; offset += kTile) UpdateRange(*v, 1, offset, kTile);
  CommitUpdate(*v, 1);
  BlockedUpdate step(*v);
  EXPECT_FALSE(step.began);
  EXPECT_THAT(ReadsAs(*pull), IsOkAndHolds(1)) << "the pull goes on meanwhile";
  pull.reset();
  step.Join();
  EXPECT_TRUE(step.began);
  for (int64_t offset = 0; offset < kElems; offset += kTile) UpdateRange(*v, 2, offset, kTile);
  CommitUpdate(*v, 2);
}

}  // namespace
}  // namespace zo
