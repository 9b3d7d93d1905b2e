// The command line of every zo binary. `--help`: exit code 0 (help is what
// was asked for), a usage line and each flag spelled with dashes, nothing
// that shows where the binary was built. A byte flag's error.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/shell_command.h"

namespace zo::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Both streams: help goes to stdout, a flag error to stderr.
ShellOutcome RunCommand(const std::string& command) { return RunShellCommand(command + " 2>&1"); }

struct Binary {
  const char* name;
  const char* path;
  const char* a_flag;  // one of its flags, as users write it

  friend void PrintTo(const Binary& b, std::ostream* os) { *os << b.name; }
};

class HelpTest : public ::testing::TestWithParam<Binary> {};

TEST_P(HelpTest, ExitsZeroWithCleanUsage) {
  for (const char* help : {"--help", "-h", "--helpfull"}) {
    const ShellOutcome r = RunCommand(std::string(GetParam().path) + " " + help);
    EXPECT_EQ(r.exit_code, 0) << help << ":\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr(std::string("usage: ") + GetParam().name)) << help;
    EXPECT_THAT(r.out, HasSubstr(std::string("\n  ") + GetParam().a_flag + " (default: "));
    EXPECT_THAT(r.out, Not(HasSubstr("Flags from")));
    EXPECT_THAT(r.out, Not(HasSubstr(".cc")));
    EXPECT_THAT(r.out, Not(HasSubstr(ZO_SOURCE_DIR)));
  }
}

INSTANTIATE_TEST_SUITE_P(Binaries, HelpTest,
                         ::testing::Values(Binary{"zo-train", ZO_TRAIN_PATH, "--pipeline-stages"},
                                           Binary{"zo-server", ZO_SERVER_PATH, "--memory-budget"},
                                           Binary{"zo-ctl", ZO_CTL_PATH, "--chunk-elems"},
                                           Binary{"zo-bench", ZO_BENCH_PATH, "--in-flight-bytes"}),
                         [](const ::testing::TestParamInfo<Binary>& info) {
                           std::string name = info.param.name;
                           name.erase(2, 1);  // "zo-train" -> "zotrain": test names are identifiers
                           return name;
                         });

// A byte flag's error names the flag and shows byte sizes, not the
// parameter counts ("13B", "350M") of a count flag.
TEST(ByteFlagTest, ZoServerMemoryBudgetNamesTheFlag) {
  const ShellOutcome r =
      RunCommand(std::string(ZO_SERVER_PATH) + " --memory-budget lots --listen 127.0.0.1:0");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--memory-budget = 'lots'"));
  EXPECT_THAT(r.out, HasSubstr("64Gi, 512Mi"));
  EXPECT_THAT(r.out, Not(HasSubstr("13B")));
}

}  // namespace
}  // namespace zo::testing
