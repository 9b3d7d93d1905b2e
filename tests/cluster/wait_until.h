// Waiting for a condition on files (a port file, a metrics line) with a
// deadline, woken by inotify on their directory and by the end of the
// processes that should produce them, not by a fixed sleep.
#ifndef ZO_TESTS_CLUSTER_WAIT_UNTIL_H_
#define ZO_TESTS_CLUSTER_WAIT_UNTIL_H_

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tests/support/child_process.h"

namespace zo::cluster {

// Returns OK once `condition` holds. It is checked at the start, after every
// change in `dir` (created, written, renamed into), and at least every
// 250 ms (a safety net for writes inotify cannot see). ABORTED, naming the
// process's log, when one of `producers` ends before `condition` holds;
// DEADLINE_EXCEEDED after `timeout`. `what` names the condition in errors.
absl::Status WaitUntil(const std::string& what, const std::function<bool()>& condition,
                       const std::string& dir,
                       const std::vector<const testing::ChildProcess*>& producers,
                       std::chrono::milliseconds timeout);

}  // namespace zo::cluster

#endif  // ZO_TESTS_CLUSTER_WAIT_UNTIL_H_
