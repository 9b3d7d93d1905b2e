#include "common/units.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using testing::StatusIs;

TEST(UnitsTest, FormatBytes) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(13e9 * 18), "217.9 GiB");  // 234e9 / 2^30 = 217.93
  EXPECT_EQ(FormatBytes(3.0 * (int64_t{1} << 40)), "3.00 TiB");
}

TEST(UnitsTest, FormatCount) {
  EXPECT_EQ(FormatCount(7), "7");
  EXPECT_EQ(FormatCount(13e9), "13.00 B");
  EXPECT_EQ(FormatCount(350e6), "350.0 M");
}

TEST(UnitsTest, ParseCountAcceptsModelSizes) {
  EXPECT_EQ(*ParseCount("13B"), 13000000000);
  EXPECT_EQ(*ParseCount("1.3b"), 1300000000);
  EXPECT_EQ(*ParseCount("350M"), 350000000);
  EXPECT_EQ(*ParseCount("125k"), 125000);
  EXPECT_EQ(*ParseCount("7e9"), 7000000000);
  EXPECT_EQ(*ParseCount(" 1000 "), 1000);
  EXPECT_EQ(*ParseCount("4Mi"), 4194304);
  EXPECT_EQ(*ParseCount("256Mi"), 268435456);
  EXPECT_EQ(*ParseCount("1.5Ki"), 1536);
}

TEST(UnitsTest, ParseCountRejectsGarbage) {
  EXPECT_THAT(ParseCount(""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a count")));
  EXPECT_THAT(ParseCount("13X"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'13X'")));
  EXPECT_THAT(ParseCount("B"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a count")));
  EXPECT_THAT(ParseCount("-5"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("between")));
  EXPECT_THAT(ParseCount("0"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("between")));
  EXPECT_THAT(ParseCount("1e30"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("between")));
}

}  // namespace
}  // namespace zo
