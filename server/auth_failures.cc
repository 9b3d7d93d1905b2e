#include "server/auth_failures.h"

#include <algorithm>

#include "absl/strings/match.h"

namespace zo {

AuthFailures::Verdict AuthFailures::Record(const std::string& host, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (hosts_.size() >= kMaxHosts && !hosts_.contains(host)) {
    auto stalest = std::min_element(hosts_.begin(), hosts_.end(), [](const auto& a, const auto& b) {
      return a.second.last_seen < b.second.last_seen;
    });
    hosts_.erase(stalest);
  }
  Host& h = hosts_[host];
  if (h.failures == 0 || now - h.window_start > kWindow) {
    h.window_start = now;
    h.failures = 0;
  }
  ++h.failures;
  h.last_seen = now;
  Verdict v;
  v.failures = h.failures;
  if (now - h.last_log >= kLogEvery) {
    v.log = true;
    h.last_log = now;
  }
  if (h.failures > kFreeFailures && waiting_ < kMaxWaiting) {
    v.delay = std::min(kMaxDelay, kDelayStep * (h.failures - kFreeFailures));
    ++waiting_;
  }
  return v;
}

void AuthFailures::DoneWaiting() {
  absl::MutexLock lock(&mu_);
  if (waiting_ > 0) --waiting_;
}

std::string PeerHost(const std::string& peer) {
  std::string rest = peer;
  for (const char* scheme : {"ipv4:", "ipv6:"}) {
    if (absl::StartsWith(rest, scheme)) rest = rest.substr(std::string(scheme).size());
  }
  const size_t colon = rest.rfind(':');
  // "[::1]:5000" and "1.2.3.4:5000" end in ":port"; "unix:/path" has none after it.
  if (colon == std::string::npos || colon + 1 == rest.size() ||
      rest.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
    return rest;
  }
  return rest.substr(0, colon);
}

}  // namespace zo
