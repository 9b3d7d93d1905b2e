// A real zo-server process for integration tests: started on a free loopback
// port (read back from --port-file), stopped with SIGTERM or killed with
// SIGKILL. Its log goes to a file named in failures.
#ifndef ZO_TESTS_SERVER_SERVER_PROCESS_H_
#define ZO_TESTS_SERVER_SERVER_PROCESS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/support/child_process.h"

namespace zo::testing {

class ServerProcess {
 public:
  // Starts `zo-server --listen 127.0.0.1:<port> <extra_args>`; port 0 picks
  // a free one. Waits until it listens.
  static absl::StatusOr<ServerProcess> Start(const std::vector<std::string>& extra_args,
                                             int port = 0);
  // Destruction sends SIGKILL if the server still runs.

  int port() const { return port_; }
  pid_t pid() const { return process_.pid(); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  const std::string& log_path() const { return process_.log_path(); }
  std::string ReadLog() const;

  // SIGTERM and wait: the exit code (-1 when killed by a signal).
  int Stop();
  // SIGKILL and wait.
  void Kill();

 private:
  ServerProcess() = default;
  ChildProcess process_;
  int port_ = 0;
};

}  // namespace zo::testing

#endif  // ZO_TESTS_SERVER_SERVER_PROCESS_H_
