#include "offload/io/aligned_buffer_pool.h"

#include <cstdint>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::StatusIs;

TEST(AlignedBufferPoolTest, BuffersAreAlignedDisjointAndRegistrable) {
  ZO_ASSERT_OK_AND_ASSIGN(auto pool, AlignedBufferPool::Create(4, 3 * 4096));
  EXPECT_EQ(pool->count(), 4u);
  EXPECT_EQ(pool->buffer_bytes(), 3u * 4096);
  std::vector<iovec> iov = pool->iovecs();
  ASSERT_EQ(iov.size(), 4u);
  for (size_t i = 0; i < iov.size(); ++i) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(iov[i].iov_base) % 4096, 0u);
    EXPECT_EQ(iov[i].iov_len, 3u * 4096);
    EXPECT_EQ(iov[i].iov_base, pool->buffer(static_cast<int>(i)));
    if (i > 0) {
      EXPECT_GE(static_cast<char*>(iov[i].iov_base),
                static_cast<char*>(iov[i - 1].iov_base) + iov[i - 1].iov_len);
    }
  }
}

TEST(AlignedBufferPoolTest, LeasesComeBack) {
  ZO_ASSERT_OK_AND_ASSIGN(auto pool, AlignedBufferPool::Create(2, 4096));
  std::optional<AlignedBufferPool::Lease> a = pool->TryAcquire();
  std::optional<AlignedBufferPool::Lease> b = pool->TryAcquire();
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_NE(a->index(), b->index());
  EXPECT_EQ(a->data(), pool->buffer(a->index()));
  EXPECT_EQ(a->size(), 4096u);
  EXPECT_FALSE(pool->TryAcquire().has_value());
  EXPECT_EQ(pool->available(), 0u);
  a->Release();
  EXPECT_FALSE(a->valid());
  EXPECT_EQ(pool->available(), 1u);
  AlignedBufferPool::Lease moved = std::move(*b);
  b.reset();  // a moved-from lease returns nothing
  EXPECT_EQ(pool->available(), 1u);
  { AlignedBufferPool::Lease gone = std::move(moved); }
  EXPECT_EQ(pool->available(), 2u);
}

TEST(AlignedBufferPoolTest, AcquireWaitsForARelease) {
  ZO_ASSERT_OK_AND_ASSIGN(auto pool, AlignedBufferPool::Create(1, 4096));
  AlignedBufferPool::Lease held = pool->Acquire();
  int got = -1;
  std::thread waiter([&] { got = pool->Acquire().index(); });
  held.Release();
  waiter.join();
  EXPECT_EQ(got, 0);
  EXPECT_EQ(pool->available(), 1u);
}

TEST(AlignedBufferPoolTest, RejectsBadSizes) {
  EXPECT_THAT(AlignedBufferPool::Create(0, 4096),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("count 0")));
  EXPECT_THAT(AlignedBufferPool::Create(2, 1000),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("multiple of 4096")));
  EXPECT_THAT(AlignedBufferPool::Create(1, size_t{2} << 30),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 GiB")));
}

}  // namespace
}  // namespace zo
