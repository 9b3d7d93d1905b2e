// Runs the real zo-ctl binary (ZO_CTL_PATH, set by tests/CMakeLists.txt) the
// way an operator would, keeping its stdout, stderr and exit code apart.
#ifndef ZO_TESTS_CLI_ZO_CTL_RUNNER_H_
#define ZO_TESTS_CLI_ZO_CTL_RUNNER_H_

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

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
  ZoCtlResult r;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_file);
  r.err.assign(std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>());
  std::filesystem::remove(err_file);
  return r;
}

}  // namespace zo::testing

#endif  // ZO_TESTS_CLI_ZO_CTL_RUNNER_H_
