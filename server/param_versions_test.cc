#include "server/param_versions.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "common/convert.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/error_detail.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using testing::IsOk;
using testing::IsOkAndHolds;
using ::testing::Optional;
using testing::StatusIs;

constexpr int64_t kElems = 64;
constexpr auto kFailedPrecondition = absl::StatusCode::kFailedPrecondition;

std::unique_ptr<ParamVersions> MakeVersions() {
  absl::StatusOr<std::unique_ptr<ParamVersions>> v = ParamVersions::Create(kElems, DType::kFloat16);
  EXPECT_THAT(v, IsOk());
  return v.ok() ? std::move(v).value() : nullptr;
}

// Fills fp16 elements with a pattern that names the version.
void Fill(void* data, uint16_t version) {
  auto* p = static_cast<uint16_t*>(data);
  for (int64_t i = 0; i < kElems; ++i) p[i] = static_cast<uint16_t>(version * 1000 + i);
}

bool Holds(const void* data, uint16_t version) {
  const auto* p = static_cast<const uint16_t*>(data);
  for (int64_t i = 0; i < kElems; ++i) {
    if (p[i] != static_cast<uint16_t>(version * 1000 + i)) return false;
  }
  return true;
}

// Writes and commits `version` (= latest() + 1).
void Write(ParamVersions& v, uint16_t version) {
  Fill(v.BeginWrite(), version);
  v.CommitWrite(version);
}

// Returns once `v` has blocked a caller `n` times in all, i.e. the other
// thread is waiting for readers (an observed state, not a sleep).
void AwaitBlocked(const ParamVersions& v, int64_t n) {
  while (v.times_blocked() < n) std::this_thread::yield();
}

// An update begun on another thread (BeginWrite), once it is seen waiting
// for readers: `began` turns true when BeginWrite returns; Join waits for it.
class BlockedUpdate {
 public:
  explicit BlockedUpdate(ParamVersions& v, ParamVersions::Undo undo = nullptr)
      : blocks_before_(v.times_blocked()), thread_([this, &v, undo = std::move(undo)] {
          target_ = v.BeginWrite(undo);
          began = true;
        }) {
    AwaitBlocked(v, blocks_before_ + 1);
  }
  ~BlockedUpdate() {
    if (thread_.joinable()) thread_.join();
  }
  void* Join() {
    thread_.join();
    return target_;
  }
  std::atomic<bool> began{false};

 private:
  const int64_t blocks_before_;  // read before the thread starts
  void* target_ = nullptr;
  std::thread thread_;
};

TEST(ParamVersionsTest, VersionZeroIsReadableAndZero) {
  std::unique_ptr<ParamVersions> v = MakeVersions();
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->elems(), kElems);
  EXPECT_EQ(v->dtype(), DType::kFloat16);
  EXPECT_EQ(v->latest(), 0);
  EXPECT_THAT(v->DataVersion(0), Optional(0));
  EXPECT_EQ(v->DataVersion(1), std::nullopt);
  EXPECT_EQ(v->DataVersion(-1), std::nullopt);
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease lease, v->Acquire(0));
  EXPECT_EQ(lease.data(), v->base_data());
  const auto* p = static_cast<const uint16_t*>(lease.data());
  for (int64_t i = 0; i < kElems; ++i) ASSERT_EQ(p[i], 0) << i;
  EXPECT_THAT(v->Acquire(1), StatusIs(kFailedPrecondition, HasSubstr("version 1 is not held")));
}

TEST(ParamVersionsTest, WritesAlternateBuffers) {
  std::unique_ptr<ParamVersions> v = MakeVersions();
  ASSERT_NE(v, nullptr);
  void* const base = v->base_data();
  void* const first = v->BeginWrite();
  EXPECT_NE(first, base) << "version 0 stays readable while version 1 is written";
  ASSERT_THAT(v->Acquire(0), IsOk());
  Fill(first, 1);
  v->CommitWrite(1);
  EXPECT_EQ(v->latest(), 1);

  void* const second = v->BeginWrite();
  EXPECT_EQ(second, base);
  {
    // Mid-write: the newest version is readable, the one being overwritten not.
    ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease lease, v->Acquire(1));
    EXPECT_EQ(lease.data(), first);
    EXPECT_TRUE(Holds(lease.data(), 1));
    EXPECT_THAT(v->Acquire(0), StatusIs(kFailedPrecondition, HasSubstr("version 0")));
    EXPECT_THAT(v->Acquire(2), StatusIs(kFailedPrecondition, HasSubstr("version 2")));
  }
  Fill(second, 2);
  v->CommitWrite(2);

  EXPECT_EQ(v->BeginWrite(), first);
  Fill(first, 3);
  v->CommitWrite(3);
  EXPECT_EQ(v->latest(), 3);
  EXPECT_THAT(v->Acquire(1), StatusIs(kFailedPrecondition, HasSubstr("latest is 3")));
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v2, v->Acquire(2));
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v3, v->Acquire(3));
  EXPECT_TRUE(Holds(v2.data(), 2));
  EXPECT_TRUE(Holds(v3.data(), 3));
  for (int64_t i = 0; i <= 3; ++i) EXPECT_THAT(v->DataVersion(i), Optional(i));
}

TEST(ParamVersionsTest, SkippedVersionSharesData) {
  std::unique_ptr<ParamVersions> v = MakeVersions();
  ASSERT_NE(v, nullptr);
  Write(*v, 1);
  v->RecordSkip(2);
  EXPECT_EQ(v->latest(), 2);
  EXPECT_THAT(v->DataVersion(2), Optional(1));
  {
    ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease a, v->Acquire(1));
    ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease b, v->Acquire(2));
    EXPECT_EQ(a.data(), b.data());
    EXPECT_TRUE(Holds(b.data(), 1));
  }
  v->RecordSkip(3);
  EXPECT_THAT(v->DataVersion(3), Optional(1));

  // Version 0 is the older distinct version: version 4 overwrites it.
  ASSERT_THAT(v->Acquire(0), IsOk());
  Write(*v, 4);
  EXPECT_THAT(v->Acquire(0), StatusIs(kFailedPrecondition, HasSubstr("version 0")));
  for (int64_t version : {1, 2, 3}) {
    ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease lease, v->Acquire(version));
    EXPECT_TRUE(Holds(lease.data(), 1)) << version;
  }
  // Version 5 overwrites the data of versions 1 to 3.
  Write(*v, 5);
  for (int64_t version : {0, 1, 2, 3}) {
    EXPECT_THAT(v->Acquire(version), StatusIs(kFailedPrecondition, HasSubstr("not held")))
        << version;
    EXPECT_THAT(v->DataVersion(version), Optional(version == 0 ? 0 : 1)) << "still known";
  }
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v4, v->Acquire(4));
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v5, v->Acquire(5));
  EXPECT_TRUE(Holds(v4.data(), 4));
  EXPECT_TRUE(Holds(v5.data(), 5));
}

TEST(ParamVersionsTest, BeginWriteWaitsForLeasesOnItsBuffer) {
  std::unique_ptr<ParamVersions> v = MakeVersions();
  ASSERT_NE(v, nullptr);
  std::optional<ParamVersions::Lease> old_lease;
  {
    ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease lease, v->Acquire(0));
    old_lease.emplace(std::move(lease));  // the moved-from lease releases nothing
  }
  // A lease on the other buffer does not hold up the write.
  Write(*v, 1);
  // Two leases on version 0's buffer, the target of the next write.
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease second_lease, v->Acquire(0));
  std::optional<ParamVersions::Lease> second(std::move(second_lease));
  // And one on version 1, which the write leaves alone.
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease newest, v->Acquire(1));

  BlockedUpdate writer(*v);
  EXPECT_FALSE(writer.began) << "two readers of version 0 remain";
  old_lease.reset();  // 2 -> 1 readers: the writer stays blocked
  EXPECT_FALSE(writer.began) << "one reader of version 0 remains";
  // Readers may keep acquiring the newest version meanwhile.
  EXPECT_THAT(v->Acquire(1), IsOk());
  second.reset();
  void* const target = writer.Join();
  EXPECT_TRUE(writer.began);
  EXPECT_EQ(target, v->base_data());
  Fill(target, 2);
  v->CommitWrite(2);
  EXPECT_TRUE(Holds(newest.data(), 1));
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v2, v->Acquire(2));
  EXPECT_TRUE(Holds(v2.data(), 2));
}

TEST(ParamVersionsTest, ResetThenCommitBase) {
  std::unique_ptr<ParamVersions> v = MakeVersions();
  ASSERT_NE(v, nullptr);
  Write(*v, 1);
  Write(*v, 2);

  ASSERT_THAT(v->Reset(10), IsOk());
  EXPECT_EQ(v->latest(), 10);
  EXPECT_THAT(v->DataVersion(10), Optional(10));
  EXPECT_EQ(v->DataVersion(9), std::nullopt);
  EXPECT_EQ(v->DataVersion(2), std::nullopt);
  EXPECT_EQ(v->DataVersion(11), std::nullopt);
  for (int64_t version : {1, 2, 10}) {
    EXPECT_THAT(v->Acquire(version), StatusIs(kFailedPrecondition, HasSubstr("not held")))
        << "nothing is held until CommitBase; version " << version;
  }
  Fill(v->base_data(), 10);
  v->CommitBase();
  {
    ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease lease, v->Acquire(10));
    EXPECT_EQ(lease.data(), v->base_data());
    EXPECT_TRUE(Holds(lease.data(), 10));
  }

  EXPECT_NE(v->BeginWrite(), v->base_data());
  v->CommitWrite(11);
  EXPECT_EQ(v->latest(), 11);
  v->RecordSkip(12);
  EXPECT_THAT(v->DataVersion(12), Optional(11));
  ASSERT_THAT(v->Acquire(10), IsOk());
  ASSERT_THAT(v->Acquire(12), IsOk());
  Write(*v, 13);
  EXPECT_THAT(v->Acquire(10), StatusIs(kFailedPrecondition, HasSubstr("version 10")));
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v13, v->Acquire(13));
  EXPECT_TRUE(Holds(v13.data(), 13));
}

// A restore that brings the version before the restored one (a DPU
// checkpoint): both are held, and the next update replaces the older.
TEST(ParamVersionsTest, ARestoreWithThePreviousVersionHoldsBoth) {
  std::unique_ptr<ParamVersions> v = MakeVersions();
  ASSERT_NE(v, nullptr);
  Write(*v, 1);
  ASSERT_THAT(v->Reset(10, ParamVersions::Previous::kStored), IsOk());
  EXPECT_EQ(v->latest(), 10);
  EXPECT_THAT(v->DataVersion(9), Optional(9));
  EXPECT_EQ(v->DataVersion(8), std::nullopt);
  ASSERT_NE(v->previous_data(), nullptr);
  EXPECT_NE(v->previous_data(), v->base_data());
  Fill(v->base_data(), 10);
  Fill(v->previous_data(), 9);
  v->CommitBase();
  EXPECT_EQ(v->previous_data(), nullptr) << "only between Reset and CommitBase";
  for (uint16_t version : {9, 10}) {
    ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease lease, v->Acquire(version));
    EXPECT_TRUE(Holds(lease.data(), version)) << version;
  }
  Write(*v, 11);  // over version 9
  EXPECT_THAT(v->Acquire(9), StatusIs(kFailedPrecondition, HasSubstr("version 9")));
  {
    ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v10, v->Acquire(10));
    EXPECT_TRUE(Holds(v10.data(), 10));
  }

  // The step between was skipped: the version before is the restored data.
  ASSERT_THAT(v->Reset(20, ParamVersions::Previous::kSameData), IsOk());
  EXPECT_EQ(v->previous_data(), nullptr);
  Fill(v->base_data(), 20);
  v->CommitBase();
  EXPECT_EQ(v->DataVersion(19), v->DataVersion(20));
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease v19, v->Acquire(19));
  EXPECT_TRUE(Holds(v19.data(), 20));
}

TEST(ParamVersionsTest, ResetWaitsForReaders) {
  std::unique_ptr<ParamVersions> v = MakeVersions();
  ASSERT_NE(v, nullptr);
  Write(*v, 1);
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease lease, v->Acquire(1));
  std::optional<ParamVersions::Lease> held(std::move(lease));
  std::atomic<bool> reset{false};
  std::thread restorer([&] {
    EXPECT_THAT(v->Reset(5), IsOk());
    reset = true;
  });
  AwaitBlocked(*v, 1);
  EXPECT_FALSE(reset);
  EXPECT_EQ(v->latest(), 1);
  held.reset();
  restorer.join();
  EXPECT_TRUE(reset);
  EXPECT_EQ(v->latest(), 5);
}

// ---- Served from the master ----

// A job's fp32 master in miniature: version k's element i is k * 100 + i / 2,
// exact in fp16 for k < 10, so a served element names its version.
class FromMasterTest : public ::testing::Test {
 protected:
  std::unique_ptr<ParamVersions> Make(bool keep_previous) {
    absl::StatusOr<std::unique_ptr<ParamVersions>> v = ParamVersions::CreateFromMaster(
        kElems, DType::kFloat16,
        {.round_master =
             [this](int64_t offset, int64_t n, void* out) {
               FloatToHalf(master_.data() + offset, static_cast<uint16_t*>(out),
                           static_cast<size_t>(n));
             },
         .keep_previous = keep_previous});
    EXPECT_THAT(v, IsOk());
    return v.ok() ? std::move(v).value() : nullptr;
  }

  static float Value(int version, int64_t i) {
    return static_cast<float>(version * 100) + i * 0.5f;
  }

  void SetMaster(int version) {
    for (int64_t i = 0; i < kElems; ++i) master_[i] = Value(version, i);
    master_version_ = version;
  }

  // The undo of an update from version `from` to `to`: recomputes the old
  // weights from the master as the update left it (so a read that ran ahead
  // of the update would read a mix), and gets every wrong_every_-th element
  // wrong by one unit in the last place, which the corrections must mend.
  ParamVersions::Undo UndoOf(int from, int to) {
    return [this, from, to](int64_t offset, int64_t n, void* out) {
      auto* half = static_cast<uint16_t*>(out);
      for (int64_t i = 0; i < n; ++i) {
        const float old = master_[offset + i] - static_cast<float>((to - from) * 100);
        FloatToHalf(&old, &half[i], 1);
        if ((offset + i) % wrong_every_ == 0) half[i] ^= 1;
      }
    };
  }

  // Sets master elements [offset, offset + n) to `version`'s values, as
  // one tile of an update begun with BeginWrite, and with a previous
  // version kept tells it the tile's old weights.
  void UpdateRange(ParamVersions& v, int version, int64_t offset, int64_t n) {
    std::vector<uint16_t> old(n);
    FloatToHalf(master_.data() + offset, old.data(), static_cast<size_t>(n));
    for (int64_t i = offset; i < offset + n; ++i) master_[i] = Value(version, i);
    if (v.keep_previous()) {
      v.MarkKept(offset, n, old.data());
    } else {
      v.MarkDone(offset, n);
    }
  }

  // Begins the update from the master's version to `version`.
  void BeginUpdate(ParamVersions& v, int version) {
    EXPECT_EQ(v.BeginWrite(v.keep_previous() ? UndoOf(master_version_, version) : nullptr),
              nullptr);
  }
  void CommitUpdate(ParamVersions& v, int version) {
    v.CommitWrite(version);
    master_version_ = version;
  }

  // An update to `version`, as the job's step makes it: tile by tile.
  void Update(ParamVersions& v, int version) {
    BeginUpdate(v, version);
    for (int64_t offset = 0; offset < kElems; offset += kTile) {
      UpdateRange(v, version, offset, kTile);
    }
    CommitUpdate(v, version);
  }
  static constexpr int64_t kTile = 16;

  // Which version elements [offset, offset + n) of `lease` read as; -1 for
  // a mix.
  static absl::StatusOr<int> ReadsAs(const ParamVersions::Lease& lease, int64_t offset = 0,
                                     int64_t n = kElems) {
    std::vector<uint16_t> half(n);
    ZO_RETURN_IF_ERROR(lease.Read(offset, n, half.data()));
    std::vector<float> got(n);
    HalfToFloat(half.data(), got.data(), half.size());
    const int version = static_cast<int>(got[0] - offset * 0.5f) / 100;
    for (int64_t i = 0; i < n; ++i) {
      if (got[i] != static_cast<float>(version * 100) + (offset + i) * 0.5f) return -1;
    }
    return version;
  }

  // A read of [offset, offset + n) begun on another thread, once it is seen
  // waiting for its range to be done: `done` turns true when it returns;
  // Join gives what it read as.
  class BlockedRead {
   public:
    BlockedRead(ParamVersions& v, const ParamVersions::Lease& lease, int64_t offset, int64_t n)
        : blocks_before_(v.times_blocked()), thread_([this, &lease, offset, n] {
            result_ = ReadsAs(lease, offset, n);
            done = true;
          }) {
      AwaitBlocked(v, blocks_before_ + 1);
    }
    ~BlockedRead() {
      if (thread_.joinable()) thread_.join();
    }
    absl::StatusOr<int> Join() {
      thread_.join();
      return result_;
    }
    std::atomic<bool> done{false};

   private:
    const int64_t blocks_before_;  // read before the thread starts
    absl::StatusOr<int> result_ = -2;
    std::thread thread_;
  };

  std::vector<float> master_ = std::vector<float>(kElems, 0.0f);
  int master_version_ = 0;
  int64_t wrong_every_ = 5;
};

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
// A piece of it read meanwhile is undone where its range is done, and waits
// for the update where it is not.
TEST_F(FromMasterTest, APieceNotYetKeptWaitsForTheUpdateToKeepIt) {
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
