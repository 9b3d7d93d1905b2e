// A real child process for integration tests: started with an argv, its
// stdout and stderr in one log file, waited for with a deadline, stopped
// with a signal. ServerProcess and the zo-train tests build on it.
#ifndef ZO_TESTS_SUPPORT_CHILD_PROCESS_H_
#define ZO_TESTS_SUPPORT_CHILD_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace zo::testing {

// pidfd_open(2): a descriptor that turns readable when `pid` ends.
int OpenPidFd(pid_t pid);
// Polls `fds` for input until one is readable (true) or `timeout` passes.
bool WaitReadable(const std::vector<int>& fds, std::chrono::milliseconds timeout);

class ChildProcess {
 public:
  // args[0] is the executable's path. The log file is truncated.
  static absl::StatusOr<ChildProcess> Start(const std::vector<std::string>& args,
                                            std::string log_path);
  ChildProcess() = default;
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ~ChildProcess();  // SIGKILL if still running

  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  std::string ReadLog() const;

  // The exit code once the process has ended (-1: killed by a signal);
  // empty when it is still running after `timeout` (zero: just look).
  // Woken by the process's end (a pidfd), not by polling.
  std::optional<int> Wait(std::chrono::milliseconds timeout);
  // A descriptor that turns readable when the process ends (poll it with
  // others); the caller closes it. -1 when the process is not running.
  int OpenExitFd() const { return pid_ > 0 ? OpenPidFd(pid_) : -1; }
  // Sends `signal` and waits: the exit code (-1: ended by the signal).
  int Signal(int signal);
  // SIGKILL and wait.
  void Kill();

 private:
  pid_t pid_ = -1;
  std::string log_path_;
};

}  // namespace zo::testing

#endif  // ZO_TESTS_SUPPORT_CHILD_PROCESS_H_
