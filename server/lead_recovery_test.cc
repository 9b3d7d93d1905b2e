// LeadRecovery against a job made of counters: which answers start a
// recovery, what the recovery does with and without a checkpoint, that one
// runs at a time, that a stale answer starts none and a new loss after a
// rollback starts one at once while a failed one waits 10 s, and that a job that gave up
// (stopped, lost) is left alone. The real job's side is covered end to end
// by tests/train/server_loss_test.cc and the chaos soak.
#include "server/lead_recovery.h"

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/error_detail.h"

namespace zo {
namespace {

using ::testing::HasSubstr;

absl::Status NoJob() {
  return WithDetail(absl::NotFoundError("no job j here"), MakeDetail(v1::ErrorDetail::NO_JOB, "j"));
}

// What the recovery did to the job.
struct FakeJob {
  std::mutex mu;
  absl::StatusOr<std::string> latest = absl::NotFoundError("no committed checkpoint of job j");
  absl::StatusOr<v1::RestoreResponse> restore_result;
  std::vector<std::string> rolled_back_to;
  std::vector<std::string> lost;
  std::vector<std::string> own_part_failures;
  std::vector<int> asked;
  // What a server answers when asked; OK when not listed. Server 2 has
  // restarted without its part until a rollback gives it back.
  std::map<int, absl::Status> answers = {{2, NoJob()}};
  bool gave_up = false;

  FakeJob() {
    v1::RestoreResponse r;
    r.set_version(10);
    r.set_path("/ckpt/j/step-00000010");
    restore_result = r;
  }

  RecoveryActions Actions() {
    return {
        .ask =
            [this](int server) {
              std::lock_guard lock(mu);
              asked.push_back(server);
              auto it = answers.find(server);
              return it == answers.end() ? absl::OkStatus() : it->second;
            },
        .roll_back =
            [this](const std::string& path) {
              std::lock_guard lock(mu);
              rolled_back_to.push_back(path);
              if (restore_result.ok()) answers.clear();  // every server holds its part
              return restore_result;
            },
        .latest_checkpoint =
            [this] {
              std::lock_guard lock(mu);
              return latest;
            },
        .version = [] { return int64_t{17}; },
        .mark_lost =
            [this](const std::string& what, const absl::Status& why) {
              std::lock_guard lock(mu);
              lost.push_back(absl::StrCat(what, " | ", why.message()));
            },
        .gave_up =
            [this] {
              std::lock_guard lock(mu);
              return gave_up;
            },
        .own_part_failed =
            [this](const absl::Status& why) {
              std::lock_guard lock(mu);
              own_part_failures.push_back(std::string(why.message()));
            },
    };
  }
};

const std::vector<std::string> kServers = {"lead:1", "a:2", "b:3"};

TEST(LeadRecoveryTest, AFollowerWithoutTheJobIsRolledBackOntoFromTheLatestCheckpoint) {
  FakeJob job;
  job.latest = std::string("/ckpt/j/step-00000010");
  LeadRecovery recovery("j", kServers, job.Actions());
  recovery.Heard(1, absl::OkStatus());
  recovery.Heard(2, absl::UnavailableError("connection refused"));
  recovery.Join();
  EXPECT_TRUE(job.rolled_back_to.empty()) << "an unreachable follower may still hold its part";
  EXPECT_EQ(recovery.followers().States()[1].state(), v1::FollowerState::UNREACHABLE);

  recovery.Heard(2, NoJob());
  recovery.Join();
  EXPECT_EQ(job.rolled_back_to, std::vector<std::string>{"/ckpt/j/step-00000010"});
  EXPECT_EQ(recovery.followers().States()[1].state(), v1::FollowerState::WITHOUT_JOB);
  EXPECT_TRUE(job.lost.empty());

  // An answer to a call from before the rollback, which gave the server its
  // part again: asked once more, it starts nothing.
  recovery.Heard(2, NoJob());
  recovery.Join();
  EXPECT_EQ(job.rolled_back_to.size(), 1u);
  EXPECT_EQ(recovery.followers().States()[1].state(), v1::FollowerState::UP);

  // A new loss right after the rollback is rolled back at once.
  {
    std::lock_guard lock(job.mu);
    job.answers[2] = NoJob();
  }
  recovery.Heard(2, NoJob());
  recovery.Join();
  EXPECT_EQ(job.rolled_back_to.size(), 2u);
}

TEST(LeadRecoveryTest, AFailedRollbackIsNotRetriedWithinTenSeconds) {
  FakeJob job;
  job.latest = std::string("/ckpt/j/step-00000010");
  job.restore_result = absl::UnavailableError("server 1 is down");
  LeadRecovery recovery("j", kServers, job.Actions());
  recovery.Heard(2, NoJob());
  recovery.Join();
  EXPECT_EQ(job.rolled_back_to.size(), 1u);
  recovery.Heard(2, NoJob());
  recovery.Join();
  EXPECT_EQ(job.rolled_back_to.size(), 1u) << "retried at once";
  EXPECT_TRUE(job.lost.empty());
}

TEST(LeadRecoveryTest, WithoutACheckpointTheJobIsMarkedLostNamingTheServerAndVersion) {
  FakeJob job;
  LeadRecovery recovery("j", kServers, job.Actions());
  recovery.Probe();
  recovery.Join();
  // Server 2 is asked again before anything is decided on its answer.
  EXPECT_EQ(job.asked, (std::vector<int>{1, 2, 2}));
  EXPECT_TRUE(job.rolled_back_to.empty());
  ASSERT_EQ(job.lost.size(), 1u);
  EXPECT_EQ(job.lost[0],
            "server 2 (b:3) restarted and lost its part of the job at version 17 | "
            "no committed checkpoint of job j");
  EXPECT_EQ(recovery.followers().States()[0].state(), v1::FollowerState::UP);
}

TEST(LeadRecoveryTest, AJobThatGaveUpIsLeftAlone) {
  FakeJob job;
  job.gave_up = true;
  LeadRecovery recovery("j", kServers, job.Actions());
  recovery.Heard(1, NoJob());
  recovery.Join();
  EXPECT_TRUE(job.lost.empty());
  EXPECT_TRUE(job.rolled_back_to.empty());
  // Still recorded: the lead's status shows it.
  EXPECT_EQ(recovery.followers().States()[0].state(), v1::FollowerState::WITHOUT_JOB);
}

TEST(LeadRecoveryTest, TheLeadsOwnPartIsRestoredOrTheJobSaysWhyNot) {
  {
    FakeJob job;
    job.latest = std::string("/ckpt/j/step-00000010");
    LeadRecovery recovery("j", kServers, job.Actions());
    recovery.RecoverOwnPart(12);
    recovery.Join();
    EXPECT_EQ(job.rolled_back_to.size(), 1u);
    EXPECT_TRUE(job.own_part_failures.empty());
  }
  {
    FakeJob job;
    job.latest = std::string("/ckpt/j/step-00000010");
    job.restore_result = absl::DataLossError("part 1 is truncated");
    LeadRecovery recovery("j", kServers, job.Actions());
    recovery.RecoverOwnPart(12);
    recovery.Join();
    ASSERT_EQ(job.own_part_failures.size(), 1u);
    EXPECT_THAT(job.own_part_failures[0],
                HasSubstr("the lead (lead:1) restarted and lost its part of the job at version 12; "
                          "restoring it failed: part 1 is truncated"));
  }
  {
    FakeJob job;
    job.latest = absl::PermissionDeniedError("cannot open /ckpt/j");
    LeadRecovery recovery("j", kServers, job.Actions());
    recovery.RecoverOwnPart(12);
    recovery.Join();
    ASSERT_EQ(job.own_part_failures.size(), 1u);
    EXPECT_THAT(job.own_part_failures[0],
                HasSubstr("its checkpoints cannot be listed: cannot open /ckpt/j"));
    EXPECT_TRUE(job.rolled_back_to.empty());
  }
  {
    FakeJob job;  // no checkpoint
    LeadRecovery recovery("j", kServers, job.Actions());
    recovery.RecoverOwnPart(12);
    recovery.Join();
    ASSERT_EQ(job.lost.size(), 1u);
    EXPECT_THAT(job.lost[0], HasSubstr("the lead (lead:1) restarted and lost its part"));
  }
}

}  // namespace
}  // namespace zo
