#include "common/command_line.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

TEST(CommandLineTest, DashesInFlagNamesBecomeUnderscores) {
  const char* args[] = {"zo-ctl",  "estimate",           "--pipeline-stages=4",
                        "-dp-ranks", "--nvme-path", "/mnt/nvme-0", "--name=a-b",
                        "-1e-3",   "--",         "--not-a-flag"};
  std::vector<std::string> storage;
  std::vector<char*> out =
      NormalizeFlagNames(10, const_cast<char**>(args), storage);
  ASSERT_EQ(out.size(), 11u);
  EXPECT_STREQ(out[1], "estimate");
  EXPECT_STREQ(out[2], "--pipeline_stages=4");
  EXPECT_STREQ(out[3], "-dp_ranks");
  EXPECT_STREQ(out[4], "--nvme_path");
  EXPECT_STREQ(out[5], "/mnt/nvme-0");  // a value, not a flag name
  EXPECT_STREQ(out[6], "--name=a-b");
  EXPECT_STREQ(out[7], "-1e-3");  // a negative number, not a flag
  EXPECT_STREQ(out[9], "--not-a-flag");
  EXPECT_EQ(out[10], nullptr);
}

}  // namespace
}  // namespace zo
