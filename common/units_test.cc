#include "common/units.h"

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
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

TEST(UnitsTest, ParseBytesTakesBinarySuffixes) {
  EXPECT_EQ(*ParseBytes("memory-budget", "64Gi"), int64_t{64} << 30);
  EXPECT_EQ(*ParseBytes("memory-budget", "512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseBytes("memory-budget", "1.5Ki"), 1536);
  EXPECT_EQ(*ParseBytes("memory-budget", " 4096 "), 4096);
  EXPECT_EQ(*ParseBytes("memory-budget", "4096B"), 4096);
  EXPECT_EQ(*ParseBytes("memory-budget", "0"), 0);
  EXPECT_EQ(*ParseBytes("memory-budget", "2ti"), int64_t{2} << 40);
}

TEST(UnitsTest, ParseBytesNamesTheFlagAndShowsByteSizes) {
  // A byte flag must not suggest parameter counts ("13B", "350M").
  for (const char* text : {"lots", "", "64Xi", "i", "1e30", "-1"}) {
    absl::StatusOr<int64_t> parsed = ParseBytes("memory-budget", text);
    EXPECT_THAT(parsed, StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr(absl::StrCat("--memory-budget = '", text, "'"))));
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("e.g. 64Gi, 512Mi or 4096"));
    EXPECT_THAT(std::string(parsed.status().message()), Not(HasSubstr("13B")));
  }
  EXPECT_THAT(ParseBytes("memory-budget", "64G"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ambiguous unit")));
  EXPECT_THAT(ParseBytes("memory-budget", "64GB"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ambiguous unit")));
}

}  // namespace
}  // namespace zo
