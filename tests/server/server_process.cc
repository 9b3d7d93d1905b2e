#include "tests/server/server_process.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"

namespace zo::testing {
namespace {

std::string UniqueName(const char* what) {
  static std::atomic<int> counter{0};
  return absl::StrCat(::testing::TempDir(), "/zo_server_", getpid(), "_", counter++, ".", what);
}

}  // namespace

absl::StatusOr<ServerProcess> ServerProcess::Start(const std::vector<std::string>& extra_args,
                                                   int port) {
  ServerProcess p;
  const std::string port_file = UniqueName("port");
  unlink(port_file.c_str());
  std::vector<std::string> args = {ZO_SERVER_PATH, "--listen", absl::StrCat("127.0.0.1:", port),
                                   "--port-file", port_file};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  ZO_ASSIGN_OR_RETURN(p.process_, ChildProcess::Start(args, UniqueName("log")));
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < give_up) {
    std::ifstream in(port_file);
    if (in >> p.port_ && p.port_ > 0) return p;
    if (p.process_.Wait(std::chrono::milliseconds(20)).has_value()) {
      return absl::InternalError(absl::StrCat("zo-server exited at start: ", p.ReadLog()));
    }
  }
  return absl::DeadlineExceededError(absl::StrCat("zo-server did not listen: ", p.ReadLog()));
}

std::string ServerProcess::ReadLog() const { return process_.ReadLog(); }

int ServerProcess::Stop() { return process_.Signal(SIGTERM); }

void ServerProcess::Kill() { process_.Kill(); }

}  // namespace zo::testing
