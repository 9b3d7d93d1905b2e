// StagingRing: regions in order, freed in any order, the free space ending
// at the oldest region held; an acquire that does not fit waits for the
// release that makes room, and never overlaps a region in use.
#include "worker/train/staging_ring.h"

#include <cstring>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo::train {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::StatusIs;

std::shared_ptr<StagingRing> Ring(size_t capacity) {
  return StagingRing::Create(
      std::shared_ptr<std::byte>(new std::byte[capacity], std::default_delete<std::byte[]>()),
      capacity);
}

TEST(StagingRingTest, RegionsComeInOrderAndTheOldestBoundsTheFreeSpace) {
  auto ring = Ring(1024);
  ZO_ASSERT_OK_AND_ASSIGN(StagingRing::Region a, ring->Acquire(400));
  ZO_ASSERT_OK_AND_ASSIGN(StagingRing::Region b, ring->Acquire(400));
  EXPECT_EQ(b.data - a.data, 448);  // rounded up to 64
  EXPECT_EQ(ring->held(), 896u);
  // b goes first: a, the oldest, still bounds the free space.
  b.owner.reset();
  EXPECT_EQ(ring->held(), 896u);
  a.owner.reset();
  EXPECT_EQ(ring->held(), 0u);
  // An empty ring starts again at its beginning.
  ZO_ASSERT_OK_AND_ASSIGN(StagingRing::Region c, ring->Acquire(100));
  EXPECT_EQ(c.data, a.data);
}

TEST(StagingRingTest, AnAcquireThatDoesNotFitWaitsForTheReleaseThatMakesRoom) {
  auto ring = Ring(1024);
  ZO_ASSERT_OK_AND_ASSIGN(StagingRing::Region a, ring->Acquire(512));
  ZO_ASSERT_OK_AND_ASSIGN(StagingRing::Region b, ring->Acquire(448));
  std::promise<StagingRing::Region> got;
  std::thread waiter([&] {
    absl::StatusOr<StagingRing::Region> r = ring->Acquire(256);
    ASSERT_TRUE(r.ok()) << r.status();
    got.set_value(*std::move(r));
  });
  std::future<StagingRing::Region> f = got.get_future();
  // Neither the 64 bytes at the end nor anything before a is free.
  EXPECT_EQ(f.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  a.owner.reset();  // [0, 512) free: the waiter wraps there
  waiter.join();
  StagingRing::Region c = f.get();
  EXPECT_EQ(c.data, a.data);
  EXPECT_EQ(ring->held(), 448u + 256u);
}

TEST(StagingRingTest, TooLargeIsRefusedAndEmptyTakesNoPlace) {
  auto ring = Ring(1024);
  EXPECT_THAT(ring->Acquire(1025).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("larger than the staging")));
  ZO_ASSERT_OK_AND_ASSIGN(StagingRing::Region empty, ring->Acquire(0));
  EXPECT_EQ(ring->held(), 0u);
  ZO_ASSERT_OK_AND_ASSIGN(StagingRing::Region whole, ring->Acquire(1024));
  EXPECT_EQ(ring->held(), 1024u);
}

// Writers on several threads, each filling its region with its own byte and
// checking it after releases elsewhere: no two held regions overlap.
TEST(StagingRingTest, HeldRegionsNeverOverlapUnderManyThreads) {
  auto ring = Ring(4096);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      for (int i = 0; i < 2000; ++i) {
        const size_t bytes = 1 + rng() % 1500;
        absl::StatusOr<StagingRing::Region> r = ring->Acquire(bytes);
        ASSERT_TRUE(r.ok()) << r.status();
        const auto mark = static_cast<std::byte>(t * 64 + i % 64);
        std::memset(r->data, static_cast<int>(mark), bytes);
        std::this_thread::yield();
        for (size_t k = 0; k < bytes; ++k) ASSERT_EQ(r->data[k], mark) << t << " " << i;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ring->held(), 0u);
}

}  // namespace
}  // namespace zo::train
