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
  const std::string& log_path() const { return log_path_; }
  std::string ReadLog() const;

  // The exit code once the process has ended (-1: killed by a signal);
  // empty when it is still running (timeout zero: just look).
  std::optional<int> Wait(std::chrono::milliseconds timeout);
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
