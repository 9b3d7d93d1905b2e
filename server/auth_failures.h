// Calls that failed the token check, counted per client host: what slows a
// token-guessing client down and keeps the log to one line per host every
// few seconds (the token itself is never logged).
//
//   AuthFailures::Verdict v = failures.Record(host, absl::Now());
//   if (v.log) ZO_LOG(WARNING) << v.failures << " calls from " << host << " ...";
//   absl::SleepFor(v.delay);  // zero until the host passes kFreeFailures
//
// Thread-safe.
#ifndef ZO_SERVER_AUTH_FAILURES_H_
#define ZO_SERVER_AUTH_FAILURES_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace zo {

class AuthFailures {
 public:
  // Failures per host and window that cost nothing: a client started with
  // the wrong token finds out at once.
  static constexpr int kFreeFailures = 5;
  static constexpr absl::Duration kWindow = absl::Minutes(1);
  // Each failure past the free ones waits this much more, up to kMaxDelay.
  static constexpr absl::Duration kDelayStep = absl::Milliseconds(100);
  static constexpr absl::Duration kMaxDelay = absl::Seconds(2);
  // At most this many failed calls wait at once (each holds a server
  // thread): beyond it they are refused at once.
  static constexpr int kMaxWaiting = 4;
  static constexpr absl::Duration kLogEvery = absl::Seconds(10);
  // Hosts remembered at once; the stalest is forgotten beyond it.
  static constexpr size_t kMaxHosts = 4096;

  struct Verdict {
    absl::Duration delay;  // how long to hold the refusal back
    int64_t failures = 0;  // from this host in the current window
    bool log = false;      // the first failure, or kLogEvery since the last line
  };
  Verdict Record(const std::string& host, absl::Time now);
  // Called after a delayed refusal has been sent (frees its waiting place).
  void DoneWaiting();

 private:
  struct Host {
    absl::Time window_start;
    int64_t failures = 0;
    absl::Time last_log = absl::InfinitePast();
    absl::Time last_seen;
  };
  absl::Mutex mu_;
  std::map<std::string, Host> hosts_ ABSL_GUARDED_BY(mu_);
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

// "ipv4:127.0.0.1:5000" -> "127.0.0.1", "ipv6:[::1]:5000" -> "[::1]": the
// client host of a gRPC peer string, without the port that changes per
// connection.
std::string PeerHost(const std::string& peer);

}  // namespace zo

#endif  // ZO_SERVER_AUTH_FAILURES_H_
