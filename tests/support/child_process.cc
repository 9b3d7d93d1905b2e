#include "tests/support/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace zo::testing {

absl::StatusOr<ChildProcess> ChildProcess::Start(const std::vector<std::string>& args,
                                                 std::string log_path) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  ChildProcess p;
  p.pid_ = pid;
  p.log_path_ = std::move(log_path);
  return p;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(other.pid_), log_path_(std::move(other.log_path_)) {
  other.pid_ = -1;
}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    Kill();
    pid_ = other.pid_;
    log_path_ = std::move(other.log_path_);
    other.pid_ = -1;
  }
  return *this;
}

ChildProcess::~ChildProcess() { Kill(); }

std::string ChildProcess::ReadLog() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int OpenPidFd(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

bool WaitReadable(const std::vector<int>& fds, std::chrono::milliseconds timeout) {
  std::vector<pollfd> polled;
  for (int fd : fds) polled.push_back({.fd = fd, .events = POLLIN, .revents = 0});
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        give_up - std::chrono::steady_clock::now());
    const int r = poll(polled.data(), polled.size(),
                       static_cast<int>(std::clamp<int64_t>(left.count(), 0, INT32_MAX)));
    if (r >= 0 || errno != EINTR) return r > 0;
  }
}

std::optional<int> ChildProcess::Wait(std::chrono::milliseconds timeout) {
  if (pid_ < 0) return std::nullopt;
  // The process's pidfd turns readable when it ends: one poll, no sleeping
  // between waitpid calls.
  if (const int pidfd = OpenPidFd(pid_); pidfd >= 0) {
    WaitReadable({pidfd}, timeout);
    close(pidfd);
  } else {
    int status = 0;
    if (timeout.count() > 0 && waitpid(pid_, &status, 0) == pid_) {  // no pidfd: block
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
  }
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  return std::nullopt;
}

int ChildProcess::Signal(int signal) {
  if (pid_ < 0) return -1;
  kill(pid_, signal);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void ChildProcess::Kill() {
  if (pid_ > 0) Signal(SIGKILL);
}

}  // namespace zo::testing
