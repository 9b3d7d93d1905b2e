#include "server/auth_failures.h"

#include "gtest/gtest.h"

namespace zo {
namespace {

TEST(AuthFailuresTest, FreeFailuresThenGrowingDelaysPerHost) {
  AuthFailures f;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (int i = 1; i <= AuthFailures::kFreeFailures; ++i) {
    const AuthFailures::Verdict v = f.Record("10.0.0.1", t0 + absl::Seconds(i));
    EXPECT_EQ(v.delay, absl::ZeroDuration()) << i;
    EXPECT_EQ(v.failures, i);
    EXPECT_EQ(v.log, i == 1) << i;  // one line per kLogEvery
  }
  AuthFailures::Verdict v = f.Record("10.0.0.1", t0 + absl::Seconds(6));
  EXPECT_EQ(v.delay, AuthFailures::kDelayStep);
  f.DoneWaiting();
  v = f.Record("10.0.0.1", t0 + absl::Seconds(11.5));
  EXPECT_EQ(v.delay, 2 * AuthFailures::kDelayStep);
  EXPECT_TRUE(v.log);  // 10 s after the last line
  EXPECT_EQ(v.failures, 7);
  f.DoneWaiting();
  // Another host starts free; a window later the first does too.
  EXPECT_EQ(f.Record("10.0.0.2", t0 + absl::Seconds(12)).delay, absl::ZeroDuration());
  v = f.Record("10.0.0.1", t0 + absl::Seconds(12) + AuthFailures::kWindow);
  EXPECT_EQ(v.delay, absl::ZeroDuration());
  EXPECT_EQ(v.failures, 1);
}

TEST(AuthFailuresTest, DelaysAreCappedAndFewWaitAtOnce) {
  AuthFailures f;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  absl::Duration last;
  int waiting = 0;
  for (int i = 0; i < 100; ++i) {
    const AuthFailures::Verdict v = f.Record("h", t0 + absl::Milliseconds(i));
    if (v.delay > absl::ZeroDuration()) ++waiting;
    last = v.delay;
  }
  // Nobody finished waiting: only kMaxWaiting were held back, the rest refused at once.
  EXPECT_EQ(waiting, AuthFailures::kMaxWaiting);
  EXPECT_EQ(last, absl::ZeroDuration());
  for (int i = 0; i < waiting; ++i) f.DoneWaiting();
  EXPECT_EQ(f.Record("h", t0 + absl::Milliseconds(200)).delay, AuthFailures::kMaxDelay);
}

TEST(AuthFailuresTest, PeerHostDropsSchemeAndPort) {
  EXPECT_EQ(PeerHost("ipv4:127.0.0.1:5000"), "127.0.0.1");
  EXPECT_EQ(PeerHost("ipv6:[::1]:5000"), "[::1]");
  EXPECT_EQ(PeerHost("ipv6:%5B::1%5D:80"), "%5B::1%5D");
  EXPECT_EQ(PeerHost("unix:/tmp/sock"), "unix:/tmp/sock");
  EXPECT_EQ(PeerHost("inproc"), "inproc");
}

}  // namespace
}  // namespace zo
