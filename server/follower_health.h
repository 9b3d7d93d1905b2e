// The lead's view of its followers: what each answered the last time the
// lead called it (the probe every 2 s while the job waits for gradients,
// every commit), so that a follower that is down or restarted empty shows
// in the lead's JobStatus, zo-ctl status and metrics within seconds, with
// since when. Thread-safe.
#ifndef ZO_SERVER_FOLLOWER_HEALTH_H_
#define ZO_SERVER_FOLLOWER_HEALTH_H_

#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/zo/v1/job.pb.h"

namespace zo {

class FollowerHealth {
 public:
  // `servers`: the job's, the lead first (not tracked).
  explicit FollowerHealth(const std::vector<std::string>& servers);

  // Server `server` (index into `servers`, >= 1) answered `answer` at `now`.
  // UNAVAILABLE and DEADLINE_EXCEEDED: unreachable; a NO_JOB detail: without
  // the job; anything else: up (it answered, with the job).
  void Record(int server, const absl::Status& answer, absl::Time now = absl::Now());

  // Every follower, in order.
  std::vector<v1::FollowerState> States() const;

  // Empty while every follower is up; otherwise one line naming the first
  // that is not, since when, and its answer.
  std::string Problem() const;

 private:
  mutable std::mutex mu_;
  std::vector<v1::FollowerState> states_;  // [i] is server i + 1
};

}  // namespace zo

#endif  // ZO_SERVER_FOLLOWER_HEALTH_H_
