// Runs the real zo-ctl binary (ZO_CTL_PATH, set by tests/CMakeLists.txt) the
// way an operator would, keeping its stdout, stderr and exit code apart.
#ifndef ZO_TESTS_CLI_ZO_CTL_RUNNER_H_
#define ZO_TESTS_CLI_ZO_CTL_RUNNER_H_

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/support/shell_command.h"

namespace zo::testing {

struct ZoCtlResult {
  int exit_code = -1;  // -1: did not exit normally
  std::string out;     // stdout
  std::string err;     // stderr
};

// `args` go through the shell as written.
inline ZoCtlResult RunZoCtl(const std::string& args) {
  const std::string err_file = std::filesystem::temp_directory_path().string() + "/zo_ctl_stderr_" +
                               std::to_string(getpid());
  const std::string command = std::string(ZO_CTL_PATH) + " " + args + " 2>" + err_file;
  const ShellOutcome run = RunShellCommand(command);
  ZoCtlResult r;
  r.exit_code = run.exit_code;
  r.out = run.out;
  std::ifstream err(err_file);
  r.err.assign(std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>());
  std::filesystem::remove(err_file);
  return r;
}

}  // namespace zo::testing

#endif  // ZO_TESTS_CLI_ZO_CTL_RUNNER_H_
