#include "worker/client/follow_job.h"

#include <deque>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

const JobMove kMove{.job = "j", .servers = {"a:1", "b:2"}, .version = 7};

// `attach` answering each of `answers` in turn, counting its calls.
struct Answers {
  std::deque<absl::Status> left;
  int calls = 0;
  absl::Status operator()() {
    ++calls;
    absl::Status next = left.front();
    left.pop_front();
    return next;
  }
};

TEST(FollowJobTest, WaitsOutWhatARestoringServerAnswers) {
  Answers answers{{absl::NotFoundError("no job yet"), absl::UnavailableError("restoring"),
                   JobMovedError(kMove),  // a stale answer naming this same move
                   absl::FailedPreconditionError("a server still without its part"),
                   absl::OkStatus()}};
  std::vector<absl::Status> retried;
  const absl::Status followed = FollowJob(
      kMove, std::ref(answers),
      {.retrying = [&](absl::Duration, const absl::Status& why) { retried.push_back(why); }});
  EXPECT_TRUE(followed.ok()) << followed;
  EXPECT_EQ(answers.calls, 5);
  EXPECT_EQ(retried.size(), 4u);
}

TEST(FollowJobTest, AMoveElsewhereOrARealErrorEndsIt) {
  const JobMove elsewhere{.job = "j", .servers = {"c:3"}, .version = 9};
  Answers moved{{absl::UnavailableError("restoring"), JobMovedError(elsewhere)}};
  const absl::Status followed = FollowJob(kMove, std::ref(moved));
  EXPECT_EQ(ParseJobMove(followed), elsewhere);
  EXPECT_EQ(moved.calls, 2);

  Answers refused{{absl::InvalidArgumentError("the manifest differs")}};
  EXPECT_EQ(FollowJob(kMove, std::ref(refused)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.calls, 1);
}

TEST(FollowJobTest, GivesUpQuotingWhatItWaitedFor) {
  Answers answers{{absl::UnavailableError("the lead is at version 3")}};
  const absl::Status followed =
      FollowJob(kMove, std::ref(answers), {.give_up = absl::ZeroDuration()});
  EXPECT_EQ(followed.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(followed.message()),
              ::testing::AllOf(::testing::HasSubstr("job j did not come up on a:1,b:2"),
                               ::testing::HasSubstr("the lead is at version 3")));
}

}  // namespace
}  // namespace zo
