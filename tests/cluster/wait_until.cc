#include "tests/cluster/wait_until.h"

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace zo::cluster {
namespace {

// Readable without blocking: the process behind this pidfd has ended.
bool Ended(int pidfd) {
  pollfd p{.fd = pidfd, .events = POLLIN, .revents = 0};
  return poll(&p, 1, 0) > 0;
}

}  // namespace

absl::Status WaitUntil(const std::string& what, const std::function<bool()>& condition,
                       const std::string& dir,
                       const std::vector<const testing::ChildProcess*>& producers,
                       std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point give_up = Clock::now() + timeout;
  const int watch = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (watch < 0 || inotify_add_watch(watch, dir.c_str(),
                                     IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO) < 0) {
    if (watch >= 0) close(watch);
    return absl::InternalError("inotify on " + dir + " failed");
  }
  // pidfds, not waitpid: the caller reaps its processes and reads their codes.
  std::vector<std::pair<int, const testing::ChildProcess*>> exits;
  for (const testing::ChildProcess* p : producers) {
    if (const int fd = p->OpenExitFd(); fd >= 0) exits.emplace_back(fd, p);
  }
  absl::Status result;
  for (;;) {
    if (condition()) break;
    const auto ended =
        std::find_if(exits.begin(), exits.end(), [](const auto& e) { return Ended(e.first); });
    if (ended != exits.end()) {
      if (condition()) break;  // it may have finished its work and exited
      result = absl::AbortedError(absl::StrCat("waiting for ", what, ": the process logging to ",
                                               ended->second->log_path(), " ended"));
      break;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - Clock::now());
    if (left.count() <= 0) {
      result = absl::DeadlineExceededError(
          absl::StrCat("waiting for ", what, ": not done after ", timeout.count(), " ms"));
      break;
    }
    std::vector<int> fds = {watch};
    for (const auto& e : exits) fds.push_back(e.first);
    testing::WaitReadable(fds, std::min(left, std::chrono::milliseconds(250)));
    char events[4096];
    while (read(watch, events, sizeof(events)) > 0) {
    }
  }
  for (const auto& e : exits) close(e.first);
  close(watch);
  return result;
}

}  // namespace zo::cluster
