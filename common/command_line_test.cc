#include "common/command_line.h"

#include <unistd.h>

#include <fstream>

#include "absl/flags/flag.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, probe_depth, 3,
          "a flag of this test only: its help is long enough to be wrapped onto a second line "
          "of the help text");

namespace zo {
namespace {

TEST(HelpTextTest, ListsThisFilesFlagsWithDashesAndNoPaths) {
  const std::string help = HelpText("usage: probe [--probe-depth N]", "common/command_line_test");
  EXPECT_EQ(help,
            "usage: probe [--probe-depth N]\n\nflags:\n"
            "  --probe-depth (default: 3)\n"
            "      a flag of this test only: its help is long enough to be wrapped onto a\n"
            "      second line of the help text\n");
}

TEST(CommandLineTest, DashesInFlagNamesBecomeUnderscores) {
  const char* args[] = {"zo-ctl",      "estimate",    "--pipeline-stages=4", "-dp-ranks",
                        "--nvme-path", "/mnt/nvme-0", "--name=a-b",          "-1e-3",
                        "--",          "--not-a-flag"};
  std::vector<std::string> storage;
  std::vector<char*> out = NormalizeFlagNames(10, const_cast<char**>(args), storage);
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

TEST(ReadFlagFileTest, ReadsTheFileOrNamesTheFlagAndPath) {
  const std::string path = ::testing::TempDir() + "/zo_flag_file_" + std::to_string(getpid());
  std::ofstream(path) << "  s3cret\n";
  absl::StatusOr<std::string> raw = ReadFlagFile("tls-ca", path);
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(*raw, "  s3cret\n");
  absl::StatusOr<std::string> token = ReadTokenFile("auth-token-file", path);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cret");
  EXPECT_THAT(ReadFlagFile("config", path + ".missing").status(),
              testing::StatusIs(absl::StatusCode::kNotFound,
                                ::testing::HasSubstr("--config: cannot read " + path)));
  std::ofstream(path) << " \n\t";
  EXPECT_THAT(ReadTokenFile("auth-token-file", path).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                ::testing::HasSubstr("--auth-token-file: " + path + " is empty")));
}

}  // namespace
}  // namespace zo
