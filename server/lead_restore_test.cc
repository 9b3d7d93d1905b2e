// LeadRestore with a job whose side is the test (what it was asked, in
// order) and whose follower is a real zo-server reached by the peer calls:
// the order of a restore (the lead's part, every follower's, the decider),
// a follower that restarted without the job, `if_restores`, and the
// refusals and failures, each leaving the servers as they were.
#include "server/lead_restore.h"

#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/checkpoint/checkpoint_test_util.h"
#include "server/lead_test_servers.h"

namespace zo {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

constexpr char kJob[] = "rs";
constexpr int64_t kVersion = 3;  // of the checkpoint the tests restore

// The job's side: where it stands, and what the restore asked of it.
class FakeJob {
 public:
  RestoreActions Actions() {
    return {
        .position =
            [this] {
              std::lock_guard lock(mu_);
              calls_.push_back("position");
              return position_;
            },
        .restore_own_part =
            [this](const v1::RestorePartRequest& request) {
              std::lock_guard lock(mu_);
              calls_.push_back("own part");
              own_requests_.push_back(request);
              return own_part_result_;
            },
        .restore_decider =
            [this](const CheckpointMeta& meta) {
              std::lock_guard lock(mu_);
              calls_.push_back(absl::StrCat("decider ", meta.applied_steps));
              return absl::OkStatus();
            },
        .ended =
            [this](const absl::Status& status, const std::string& dir) {
              std::lock_guard lock(mu_);
              calls_.push_back(absl::StrCat("ended ", absl::StatusCodeToString(status.code())));
              ended_dirs_.push_back(dir);
            },
    };
  }

  void set_position(RestorePosition p) {
    std::lock_guard lock(mu_);
    position_ = p;
  }
  void set_own_part_result(absl::Status s) {
    std::lock_guard lock(mu_);
    own_part_result_ = std::move(s);
  }
  std::vector<std::string> calls() {
    std::lock_guard lock(mu_);
    return calls_;
  }
  std::vector<v1::RestorePartRequest> own_requests() {
    std::lock_guard lock(mu_);
    return own_requests_;
  }
  std::vector<std::string> ended_dirs() {
    std::lock_guard lock(mu_);
    return ended_dirs_;
  }

 private:
  std::mutex mu_;
  RestorePosition position_{.restores_done = 0, .version = 7, .base_version = 6, .generation = 5};
  absl::Status own_part_result_;
  std::vector<std::string> calls_;
  std::vector<v1::RestorePartRequest> own_requests_;
  std::vector<std::string> ended_dirs_;
};

// Two servers: the lead's slot (whose part is the fake's) and a real
// follower holding the job at version 0; a committed checkpoint of both
// parts at kVersion under the root.
class LeadRestoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_THAT(servers_.Start(kJob), IsOk());
    ZO_ASSERT_OK_AND_ASSIGN(checkpoint_,
                            testing::WriteTestCheckpoint(root_, kJob, kVersion, state_));
    UseServers(servers_.addresses);
  }
  void TearDown() override {
    restore_.reset();
    servers_.Stop();
    std::filesystem::remove_all(root_);
  }

  // A restore for a lead of these servers, with checkpoints under `root`.
  void UseServers(const std::vector<std::string>& servers, std::string root = "") {
    ZO_ASSERT_OK_AND_ASSIGN(spec_,
                            JobSpecFromRequest(testing::LeadTestJobRequest(kJob, servers, 0)));
    restore_ =
        std::make_unique<LeadRestore>(LeadRestore::Options{.spec = &spec_,
                                                           .peers = &peers_,
                                                           .peer_timeout = absl::Seconds(3),
                                                           .root = root.empty() ? root_ : root},
                                      job_.Actions());
  }
  int64_t FollowerVersion(const std::string& address) {
    absl::StatusOr<v1::JobStatus> status = peers_.GetJobStatus(address, kJob, absl::Seconds(5));
    return status.ok() ? status->version() : -1;
  }

  const std::string root_ = testing::FreshTestDir("lead_restore");
  const testing::FlatState state_ = testing::MakeFlatState(
      {{"w", {100}, DType::kFloat16}}, /*chunk_elems=*/64, /*num_servers=*/2, /*seed=*/11);
  std::string checkpoint_;
  testing::LeadTestServers servers_;
  PeerClient peers_{PeerCredentials{}};
  JobSpec spec_;
  FakeJob job_;
  std::unique_ptr<LeadRestore> restore_;
};

TEST_F(LeadRestoreTest, TheLatestIsRestoredOnTheLeadThenTheFollowerThenTheDecider) {
  ZO_ASSERT_OK_AND_ASSIGN(const v1::RestoreResponse answer,
                          restore_->Run("", /*rollback=*/false, std::nullopt));
  EXPECT_EQ(answer.path(), checkpoint_);
  EXPECT_EQ(answer.version(), kVersion);
  EXPECT_EQ(answer.base_version(), 6);  // the job's, asked after
  EXPECT_FALSE(answer.already_restored());
  // The decider gets the checkpoint's applied steps (TestMeta: version - 1).
  EXPECT_THAT(job_.calls(),
              ElementsAre("position", "own part", "decider 2", "ended OK", "position"));
  EXPECT_THAT(job_.ended_dirs(), ElementsAre(checkpoint_));
  const std::vector<v1::RestorePartRequest> own = job_.own_requests();
  ASSERT_EQ(own.size(), 1u);
  EXPECT_EQ(own[0].path(), checkpoint_);
  EXPECT_EQ(own[0].job(), kJob);
  EXPECT_NE(own[0].generation(), 5);  // a generation the servers are not in
  EXPECT_FALSE(own[0].rollback());
  EXPECT_EQ(FollowerVersion(servers_.addresses[1]), kVersion);
}

// A follower that restarted without the job answers NO_JOB: its part is
// opened there again (by the lead) and restored with the rest.
TEST_F(LeadRestoreTest, AFollowerWithoutTheJobHasItsPartOpenedAgainAndRestored) {
  ZO_ASSERT_OK_AND_ASSIGN(std::unique_ptr<OffloadServer> restarted, testing::StartLoopbackServer());
  const std::string address = testing::LoopbackAddress(*restarted);
  ASSERT_EQ(FollowerVersion(address), -1);  // no job there
  UseServers({servers_.addresses[0], address});
  ZO_ASSERT_OK_AND_ASSIGN(const v1::RestoreResponse answer,
                          restore_->Run(checkpoint_, /*rollback=*/true, std::nullopt));
  EXPECT_EQ(answer.version(), kVersion);
  EXPECT_TRUE(job_.own_requests().at(0).rollback());
  EXPECT_EQ(FollowerVersion(address), kVersion);
  restore_.reset();
  restarted->Shutdown(absl::ZeroDuration());
}

TEST_F(LeadRestoreTest, ARestoreThatAlreadyHappenedDoesNothing) {
  job_.set_position({.restores_done = 2, .version = 9, .base_version = 8, .generation = 5});
  ZO_ASSERT_OK_AND_ASSIGN(const v1::RestoreResponse answer,
                          restore_->Run("", /*rollback=*/true, /*if_restores=*/1));
  EXPECT_TRUE(answer.already_restored());
  EXPECT_EQ(answer.version(), 9);
  EXPECT_EQ(answer.base_version(), 8);
  EXPECT_THAT(job_.calls(), ElementsAre("position"));
  EXPECT_EQ(FollowerVersion(servers_.addresses[1]), 0);
  // The count it was asked for: it runs.
  ZO_ASSERT_OK_AND_ASSIGN(const v1::RestoreResponse ran,
                          restore_->Run("", /*rollback=*/true, /*if_restores=*/2));
  EXPECT_FALSE(ran.already_restored());
  EXPECT_EQ(FollowerVersion(servers_.addresses[1]), kVersion);
}

TEST_F(LeadRestoreTest, AnotherJobsCheckpointIsRefusedBeforeAnyServerIsTouched) {
  const testing::FlatState other = testing::MakeFlatState(
      {{"x", {100}, DType::kFloat16}}, /*chunk_elems=*/64, /*num_servers=*/2, /*seed=*/11);
  const std::string other_root = testing::FreshTestDir("lead_restore_other");
  ZO_ASSERT_OK_AND_ASSIGN(const std::string dir,
                          testing::WriteTestCheckpoint(other_root, kJob, kVersion, other));
  EXPECT_THAT(restore_->Run(dir, false, std::nullopt).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("holds a different manifest than job rs")));
  EXPECT_THAT(job_.calls(), ElementsAre("position"));
  EXPECT_EQ(FollowerVersion(servers_.addresses[1]), 0);
  std::filesystem::remove_all(other_root);
}

TEST_F(LeadRestoreTest, ALeadPartThatFailsEndsTheRestoreBeforeTheFollowers) {
  job_.set_own_part_result(absl::DataLossError("part 0 is torn"));
  EXPECT_THAT(restore_->Run("", false, std::nullopt).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("part 0 is torn")));
  EXPECT_THAT(job_.calls(), ElementsAre("position", "own part", "ended DATA_LOSS"));
  EXPECT_EQ(FollowerVersion(servers_.addresses[1]), 0);
}

TEST_F(LeadRestoreTest, AFollowerThatIsDownFailsTheRestoreAndTheDeciderIsLeft) {
  servers_.follower->Shutdown(absl::ZeroDuration());
  EXPECT_THAT(restore_->Run("", false, std::nullopt).status(),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  EXPECT_THAT(job_.calls(), ElementsAre("position", "own part", "ended UNAVAILABLE"));
}

TEST_F(LeadRestoreTest, WithoutACheckpointRootOnlyAPathRestores) {
  restore_ = std::make_unique<LeadRestore>(
      LeadRestore::Options{.spec = &spec_, .peers = &peers_, .root = ""}, job_.Actions());
  EXPECT_THAT(restore_->Latest().status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("--checkpoint-dir")));
  EXPECT_THAT(restore_->Run("", false, std::nullopt).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no checkpoint path")));
  EXPECT_THAT(job_.calls(), ElementsAre("position"));
  ZO_ASSERT_OK_AND_ASSIGN(const v1::RestoreResponse answer,
                          restore_->Run(checkpoint_, false, std::nullopt));
  EXPECT_EQ(answer.version(), kVersion);
}

TEST_F(LeadRestoreTest, AnEmptyRootHasNoLatest) {
  const std::string empty = testing::FreshTestDir("lead_restore_empty");
  UseServers(servers_.addresses, empty);
  EXPECT_THAT(restore_->Run("", false, std::nullopt).status(), ::testing::Not(IsOk()));
  EXPECT_THAT(job_.calls(), ElementsAre("position"));
  EXPECT_THAT(job_.ended_dirs(), IsEmpty());
  std::filesystem::remove_all(empty);
}

}  // namespace
}  // namespace zo
