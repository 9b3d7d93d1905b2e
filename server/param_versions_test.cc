#include "server/param_versions.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

#include "common/dtype.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using testing::IsOk;
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

  std::atomic<bool> began{false};
  void* target = nullptr;
  std::thread writer([&] {
    target = v->BeginWrite();
    began = true;
  });
  AwaitBlocked(*v, 1);
  EXPECT_FALSE(began) << "two readers of version 0 remain";
  old_lease.reset();  // 2 -> 1 readers: the writer stays blocked
  EXPECT_FALSE(began) << "one reader of version 0 remains";
  // Readers may keep acquiring the newest version meanwhile.
  EXPECT_THAT(v->Acquire(1), IsOk());
  second.reset();
  writer.join();
  EXPECT_TRUE(began);
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

  v->Reset(10);
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

TEST(ParamVersionsTest, ResetWaitsForReaders) {
  std::unique_ptr<ParamVersions> v = MakeVersions();
  ASSERT_NE(v, nullptr);
  Write(*v, 1);
  ZO_ASSERT_OK_AND_ASSIGN(ParamVersions::Lease lease, v->Acquire(1));
  std::optional<ParamVersions::Lease> held(std::move(lease));
  std::atomic<bool> reset{false};
  std::thread restorer([&] {
    v->Reset(5);
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
