#include "server/follower_health.h"

#include "absl/strings/str_cat.h"
#include "rpc/error_detail.h"

namespace zo {

FollowerHealth::FollowerHealth(const std::vector<std::string>& servers) {
  for (size_t i = 1; i < servers.size(); ++i) {
    v1::FollowerState& s = states_.emplace_back();
    s.set_server(servers[i]);
  }
}

void FollowerHealth::Record(int server, const absl::Status& answer, absl::Time now) {
  v1::FollowerState::State state = v1::FollowerState::UP;
  if (absl::IsUnavailable(answer) || absl::IsDeadlineExceeded(answer)) {
    state = v1::FollowerState::UNREACHABLE;
  } else if (ReasonOf(answer) == v1::ErrorDetail::NO_JOB) {
    state = v1::FollowerState::WITHOUT_JOB;
  }
  std::lock_guard lock(mu_);
  if (server < 1 || server > static_cast<int>(states_.size())) return;
  v1::FollowerState& s = states_[server - 1];
  if (s.state() != state || s.since_unix_ms() == 0) {
    s.set_state(state);
    s.set_since_unix_ms(absl::ToUnixMillis(now));
  }
  s.set_error(state == v1::FollowerState::UP ? "" : std::string(answer.message()));
}

std::vector<v1::FollowerState> FollowerHealth::States() const {
  std::lock_guard lock(mu_);
  return states_;
}

std::string FollowerHealth::Problem() const {
  std::lock_guard lock(mu_);
  for (const v1::FollowerState& s : states_) {
    if (s.state() == v1::FollowerState::UP) continue;
    return absl::StrCat(
        "follower ", s.server(),
        s.state() == v1::FollowerState::UNREACHABLE ? " unreachable" : " lost the job (restarted)",
        " since ",
        absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(s.since_unix_ms()),
                         absl::UTCTimeZone()),
        ": ", s.error());
  }
  return "";
}

}  // namespace zo
