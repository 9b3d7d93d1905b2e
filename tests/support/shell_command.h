// Runs a command line through the shell, as a person would type it, and
// keeps what it wrote to stdout and how it exited. For the CLI tests.
#ifndef ZO_TESTS_SUPPORT_SHELL_COMMAND_H_
#define ZO_TESTS_SUPPORT_SHELL_COMMAND_H_

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace zo::testing {

struct ShellOutcome {
  int exit_code = -1;  // -1: did not start or did not exit normally
  std::string out;     // stdout (add 2>&1 to the command for stderr too)
};

inline ShellOutcome RunShellCommand(const std::string& command) {
  ShellOutcome r;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace zo::testing

#endif  // ZO_TESTS_SUPPORT_SHELL_COMMAND_H_
