#include "tests/server/server_process.h"

#include <signal.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <vector>

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
  // $ZO_SERVER_PATH, when set, replaces the build's binary (a copied test
  // run on another machine, deploy/gpu-check.sh).
  const char* binary = std::getenv("ZO_SERVER_PATH");
  std::vector<std::string> args = {binary != nullptr ? binary : ZO_SERVER_PATH, "--listen",
                                   absl::StrCat("127.0.0.1:", port), "--port-file", port_file};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  // zo-server renames the port file into place once it listens: wait for
  // that rename (inotify) or the process's end, not for a clock.
  const int watch = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (watch < 0 || inotify_add_watch(watch, ::testing::TempDir().c_str(), IN_MOVED_TO) < 0) {
    if (watch >= 0) close(watch);
    return absl::InternalError("inotify on the test temp dir failed");
  }
  absl::StatusOr<ChildProcess> child = ChildProcess::Start(args, UniqueName("log"));
  if (!child.ok()) {
    close(watch);
    return child.status();
  }
  p.process_ = *std::move(child);
  const int exited = p.process_.OpenExitFd();
  absl::Status status = absl::DeadlineExceededError("zo-server did not listen within 30 s: ");
  for (;;) {
    std::ifstream in(port_file);
    if (in >> p.port_ && p.port_ > 0) {
      status = absl::OkStatus();
      break;
    }
    if (p.process_.Wait(std::chrono::milliseconds(0)).has_value()) {
      status = absl::InternalError("zo-server exited at start: ");
      break;
    }
    std::vector<int> fds = {watch};
    if (exited >= 0) fds.push_back(exited);
    if (!WaitReadable(fds, std::chrono::seconds(30))) break;
    char events[4096];
    while (read(watch, events, sizeof(events)) > 0) {
    }
  }
  close(watch);
  if (exited >= 0) close(exited);
  if (!status.ok()) return absl::Status(status.code(), absl::StrCat(status.message(), p.ReadLog()));
  return p;
}

std::string ServerProcess::ReadLog() const { return process_.ReadLog(); }

int ServerProcess::Stop() { return process_.Signal(SIGTERM); }

void ServerProcess::Kill() { process_.Kill(); }

}  // namespace zo::testing
