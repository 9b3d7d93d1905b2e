#include "common/range_set.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace zo {
namespace {

TEST(RangeSetTest, MergesTouchingAndOverlappingRanges) {
  RangeSet set;
  EXPECT_TRUE(set.Contains(5, 5));
  EXPECT_FALSE(set.Contains(0, 1));
  set.Add(10, 20);
  set.Add(30, 40);
  EXPECT_EQ(set.size(), 20);
  EXPECT_TRUE(set.Contains(12, 20));
  EXPECT_FALSE(set.Contains(15, 35)) << "a gap in between";
  set.Add(20, 30);  // touches both
  EXPECT_TRUE(set.Contains(10, 40));
  EXPECT_EQ(set.size(), 30);
  set.Add(5, 45);  // covers everything
  EXPECT_EQ(set.size(), 40);
  EXPECT_FALSE(set.Contains(4, 6));
  set.Add(7, 3);  // empty: ignored
  EXPECT_EQ(set.size(), 40);
  set.Clear();
  EXPECT_EQ(set.size(), 0);
  EXPECT_FALSE(set.Contains(10, 11));
}

// Random ranges against a bitmap.
TEST(RangeSetTest, AgreesWithABitmap) {
  constexpr int64_t kElems = 200;
  std::mt19937 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    RangeSet set;
    std::vector<bool> bits(kElems, false);
    for (int i = 0; i < 12; ++i) {
      const int64_t begin = static_cast<int64_t>(rng() % kElems);
      const int64_t end = begin + static_cast<int64_t>(rng() % 20);
      set.Add(begin, std::min(end, kElems));
      for (int64_t e = begin; e < std::min(end, kElems); ++e) bits[e] = true;
      int64_t count = 0;
      for (bool b : bits) count += b;
      ASSERT_EQ(set.size(), count);
      for (int64_t b = 0; b < kElems; b += 7) {
        for (int64_t e = b; e <= std::min(b + 30, kElems); e += 3) {
          bool all = true, any = false;
          for (int64_t x = b; x < e; ++x) {
            all = all && bits[x];
            any = any || bits[x];
          }
          ASSERT_EQ(set.Contains(b, e), all) << "[" << b << ", " << e << ")";
          ASSERT_EQ(set.Overlaps(b, e), any) << "[" << b << ", " << e << ")";
        }
      }
    }
  }
}

}  // namespace
}  // namespace zo
