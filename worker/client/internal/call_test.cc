#include "worker/client/internal/call.h"

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo::client_internal {
namespace {

using ::testing::HasSubstr;

CallSettings Fast(absl::Duration retry_for) {
  CallSettings s;
  s.retry_for = retry_for;
  s.first_backoff = absl::Milliseconds(1);
  s.max_backoff = absl::Milliseconds(1);
  return s;
}

TEST(RetryCallTest, RetriesUntilTheServerAnswers) {
  int attempts = 0;
  const absl::Status s =
      RetryCall(Fast(absl::Seconds(10)), "s:1", nullptr, [&](grpc::ClientContext&) {
        return ++attempts < 3 ? absl::UnavailableError("down") : absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(attempts, 3);
}

TEST(RetryCallTest, OtherCodesSurfaceAtOnceNamingTheServer) {
  int attempts = 0;
  const absl::Status s =
      RetryCall(Fast(absl::Seconds(10)), "s:1", nullptr, [&](grpc::ClientContext&) {
        ++attempts;
        return absl::NotFoundError("no job");
      });
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("server s:1: no job"));
  EXPECT_EQ(attempts, 1);
}

// A call that was in flight longer than the retry window (a pull waiting for
// its version) and then lost its connection is still retried: the window
// opens at the failure.
// The retry window's clock in ALongAttemptThatFailsIsStillRetried.
absl::Time fake_now = absl::UnixEpoch();

TEST(RetryCallTest, ALongAttemptThatFailsIsStillRetried) {
  CallSettings settings = Fast(absl::Milliseconds(200));
  settings.now = [] { return fake_now; };
  int attempts = 0;
  const absl::Status s = RetryCall(settings, "s:1", nullptr, [&](grpc::ClientContext&) {
    if (++attempts == 1) {
      // Stands in for a long wait on the server (longer than retry_for).
      fake_now += absl::Milliseconds(300);
      return absl::UnavailableError("connection reset");
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(attempts, 2);
}

TEST(RetryCallTest, GivesUpAfterTheWindowSayingHowOften) {
  int attempts = 0;
  const absl::Status s =
      RetryCall(Fast(absl::Milliseconds(30)), "s:1", nullptr, [&](grpc::ClientContext&) {
        ++attempts;
        return absl::UnavailableError("down");
      });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("server s:1: down (gave up after "));
  EXPECT_GT(attempts, 2);
}

TEST(CallGroupTest, CancellingAParentCancelsItsChildrenAndTheirSleeps) {
  CallGroup parent;
  CallGroup child;
  ASSERT_TRUE(parent.AddChild(&child));
  std::thread sleeper([&] { EXPECT_FALSE(child.Sleep(absl::Hours(1))); });
  parent.CancelAll();
  sleeper.join();
  EXPECT_TRUE(child.cancelled());
  // A child added after the cancellation is refused and stays as it was.
  CallGroup late;
  EXPECT_FALSE(parent.AddChild(&late));
  EXPECT_FALSE(late.cancelled());
}

TEST(CallGroupTest, ARemovedChildIsNotCancelled) {
  CallGroup parent;
  CallGroup child;
  ASSERT_TRUE(parent.AddChild(&child));
  parent.RemoveChild(&child);
  parent.CancelAll();
  EXPECT_FALSE(child.cancelled());
}

TEST(CallGroupTest, CancellingAChildLeavesItsParent) {
  CallGroup parent;
  CallGroup child;
  ASSERT_TRUE(parent.AddChild(&child));
  child.CancelAll();
  EXPECT_FALSE(parent.cancelled());
  parent.RemoveChild(&child);
}

}  // namespace
}  // namespace zo::client_internal
