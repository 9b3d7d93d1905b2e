// ParamVersions holding its versions in buffers of its own: alternation,
// skips, leases, resets and restores. Versions served from the master are
// in param_versions_master_test.cc and param_versions_writing_test.cc.
#include "server/param_versions.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "common/dtype.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/param_versions_test_util.h"

namespace zo {
namespace {

using testing::AwaitBlocked;
using testing::BlockedUpdate;
using ::testing::HasSubstr;
using testing::IsOk;
using testing::kElems;
using testing::kFailedPrecondition;
using ::testing::Optional;
using testing::StatusIs;

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

}  // namespace
}  // namespace zo
