#include "tests/server/server_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
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
  p.log_path_ = UniqueName("log");
  unlink(port_file.c_str());
  std::vector<std::string> args = {ZO_SERVER_PATH, "--listen", absl::StrCat("127.0.0.1:", port),
                                   "--port-file", port_file};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    const int fd = open(p.log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  p.pid_ = pid;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < give_up) {
    std::ifstream in(port_file);
    if (in >> p.port_ && p.port_ > 0) return p;
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      p.pid_ = -1;
      return absl::InternalError(absl::StrCat("zo-server exited at start: ", p.ReadLog()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("zo-server did not listen: ", p.ReadLog()));
}

ServerProcess::ServerProcess(ServerProcess&& other) noexcept
    : pid_(other.pid_), port_(other.port_), log_path_(std::move(other.log_path_)) {
  other.pid_ = -1;
}

ServerProcess& ServerProcess::operator=(ServerProcess&& other) noexcept {
  if (this != &other) {
    Kill();
    pid_ = other.pid_;
    port_ = other.port_;
    log_path_ = std::move(other.log_path_);
    other.pid_ = -1;
  }
  return *this;
}

ServerProcess::~ServerProcess() { Kill(); }

std::string ServerProcess::ReadLog() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int ServerProcess::Stop() {
  if (pid_ < 0) return -1;
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void ServerProcess::Kill() {
  if (pid_ < 0) return;
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

}  // namespace zo::testing
