#include "server/follower_health.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/error_detail.h"

namespace zo {
namespace {

using ::testing::HasSubstr;

TEST(FollowerHealthTest, TracksEachFollowersStateAndSinceWhen) {
  FollowerHealth health({"lead:1", "a:2", "b:3"});
  const absl::Time t0 = absl::FromUnixSeconds(1'800'000'000);
  EXPECT_EQ(health.Problem(), "");
  ASSERT_EQ(health.States().size(), 2u);
  EXPECT_EQ(health.States()[0].since_unix_ms(), 0);  // not asked yet

  health.Record(1, absl::OkStatus(), t0);
  health.Record(2, absl::UnavailableError("connection refused"), t0);
  health.Record(2, absl::DeadlineExceededError("slow"), t0 + absl::Seconds(2));
  std::vector<v1::FollowerState> states = health.States();
  EXPECT_EQ(states[0].state(), v1::FollowerState::UP);
  EXPECT_EQ(states[1].server(), "b:3");
  EXPECT_EQ(states[1].state(), v1::FollowerState::UNREACHABLE);
  // Still unreachable: since the first failure, with the latest answer.
  EXPECT_EQ(states[1].since_unix_ms(), absl::ToUnixMillis(t0));
  EXPECT_EQ(states[1].error(), "slow");
  EXPECT_THAT(health.Problem(), HasSubstr("follower b:3 unreachable since 2027-01-15"));

  // Restarted empty, then rolled back and up again.
  health.Record(2,
                WithDetail(absl::NotFoundError("no job"), MakeDetail(v1::ErrorDetail::NO_JOB, "j")),
                t0 + absl::Seconds(4));
  EXPECT_EQ(health.States()[1].state(), v1::FollowerState::WITHOUT_JOB);
  EXPECT_THAT(health.Problem(), HasSubstr("follower b:3 lost the job (restarted)"));
  // An answer that is a refusal still means it is up with the job.
  health.Record(2, absl::FailedPreconditionError("step 3 is not open"), t0 + absl::Seconds(6));
  EXPECT_EQ(health.States()[1].state(), v1::FollowerState::UP);
  EXPECT_EQ(health.States()[1].since_unix_ms(), absl::ToUnixMillis(t0 + absl::Seconds(6)));
  EXPECT_EQ(health.Problem(), "");
  health.Record(7, absl::UnavailableError("no such follower"));  // ignored
  EXPECT_EQ(health.Problem(), "");
}

}  // namespace
}  // namespace zo
