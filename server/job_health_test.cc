// JobHealth's states and transitions: what callers are told in each (the
// code they act on, and the typed reason), what JobStatus shows, that every
// change reaches the job (on_change), and the follower's two waits for its
// lead. The job's side is covered by server/job_test.cc and, with real
// servers killed, by tests/train/server_loss_test.cc.
#include "server/job_health.h"

#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/error_detail.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

class JobHealthTest : public ::testing::Test {
 protected:
  v1::JobStatus Shown() const {
    v1::JobStatus status;
    health_.AddTo(status);
    return status;
  }

  std::vector<absl::Status> changes_;
  JobHealth health_{"j", "lead:1", [this](const absl::Status& h) { changes_.push_back(h); }};
};

TEST_F(JobHealthTest, AFailedStepNeedsARestoreThatCallersAreToldIsNobodysYet) {
  EXPECT_TRUE(health_.ok());
  EXPECT_EQ(Shown().needs_restore(), "");
  health_.Fail(absl::InternalError("NVMe read failed"));
  EXPECT_FALSE(health_.ok());
  ASSERT_EQ(changes_.size(), 1u);
  EXPECT_THAT(changes_[0], StatusIs(absl::StatusCode::kInternal, ::testing::_));
  const absl::Status told = health_.NeedsRestore();
  EXPECT_THAT(told, StatusIs(absl::StatusCode::kFailedPrecondition,
                             "job j needs restore: NVMe read failed"));
  EXPECT_EQ(ReasonOf(told), v1::ErrorDetail::NEEDS_RESTORE);
  EXPECT_EQ(Shown().needs_restore(), "NVMe read failed");
  EXPECT_FALSE(Shown().restoring());
}

TEST_F(JobHealthTest, ARestoreIsWaitedForAndOnlyTheLeadsWholeRestoreCounts) {
  health_.BeginRestore();
  EXPECT_TRUE(health_.restoring());
  EXPECT_EQ(health_.restores_begun(), 1);
  EXPECT_THAT(health_.NeedsRestore(), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  EXPECT_EQ(ReasonOf(health_.NeedsRestore()), v1::ErrorDetail::REASON_UNSPECIFIED);
  EXPECT_TRUE(Shown().restoring());

  // The lead's own part is back; its followers' are not yet.
  health_.EndRestore(absl::OkStatus(), "/c/step-3", /*healthy_after=*/false);
  EXPECT_FALSE(health_.restoring());
  EXPECT_FALSE(health_.ok());
  EXPECT_TRUE(Shown().restoring());
  EXPECT_EQ(health_.restores_done(), 0);

  health_.LeadRestoreEnded(absl::OkStatus(), "/c/step-3");
  EXPECT_TRUE(health_.ok());
  EXPECT_THAT(changes_.back(), IsOk());
  EXPECT_EQ(health_.restores_done(), 1);
  EXPECT_EQ(Shown().restores(), 1);

  // A follower's part: healthy once its part is back.
  health_.BeginRestore();
  health_.EndRestore(absl::OkStatus(), "/c/step-3", /*healthy_after=*/true);
  EXPECT_TRUE(health_.ok());
  EXPECT_EQ(health_.restores_begun(), 2);
  EXPECT_EQ(health_.restores_done(), 1);
}

TEST_F(JobHealthTest, FailedRestoresLeaveTheJobNeedingOneSayingWhere) {
  health_.BeginRestore();
  health_.EndRestore(absl::DataLossError("bad checksum"), "/c/step-3", true);
  EXPECT_THAT(health_.status(),
              StatusIs(absl::StatusCode::kDataLoss, "restore from /c/step-3 failed: bad checksum"));
  EXPECT_EQ(ReasonOf(health_.NeedsRestore()), v1::ErrorDetail::NEEDS_RESTORE);
  health_.LeadRestoreEnded(absl::UnavailableError("server 2 is down"), "/c/step-3");
  EXPECT_THAT(health_.status(), StatusIs(absl::StatusCode::kDataLoss,
                                         "partial restore from /c/step-3: server 2 is down"));
  EXPECT_EQ(health_.restores_done(), 0);
}

TEST_F(JobHealthTest, ALostJobStaysLostUntilARestoreFromElsewhere) {
  EXPECT_TRUE(health_.MarkLost("server 1 lost its part"));
  EXPECT_TRUE(health_.lost());
  EXPECT_THAT(health_.status(), StatusIs(absl::StatusCode::kDataLoss, "server 1 lost its part"));
  EXPECT_FALSE(health_.MarkLost("again"));
  EXPECT_EQ(changes_.size(), 1u);
  // The recovery of the lead's own part does not turn a lost job around.
  health_.OwnPartFailed(absl::NotFoundError("no checkpoint"));
  EXPECT_THAT(health_.status(), StatusIs(absl::StatusCode::kDataLoss, ::testing::_));
  health_.BeginRestore();
  health_.EndRestore(absl::OkStatus(), "/elsewhere/step-9", false);
  health_.LeadRestoreEnded(absl::OkStatus(), "/elsewhere/step-9");
  EXPECT_FALSE(health_.lost());
  EXPECT_TRUE(health_.ok());
}

TEST_F(JobHealthTest, ALeadThatRestartedWaitsForItsRecoveryOrSaysWhyItFailed) {
  health_.RecoveringOwnPart(12);
  EXPECT_THAT(health_.status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("version 12")));
  health_.OwnPartFailed(absl::NotFoundError("no committed checkpoint of job j"));
  EXPECT_THAT(health_.status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "no committed checkpoint of job j"));
}

TEST_F(JobHealthTest, AFollowerOpenedByItsLeadWaitsForTheLeadsRestore) {
  health_.AwaitLeadRestore();
  EXPECT_TRUE(health_.AwaitingLeadRestore());
  EXPECT_THAT(health_.status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("waits for the lead (lead:1)")));
  health_.LeadAnswered();  // not what it waits for
  EXPECT_TRUE(health_.AwaitingLeadRestore());
  health_.BeginRestore();
  health_.EndRestore(absl::OkStatus(), "/c/step-3", true);
  EXPECT_FALSE(health_.AwaitingLeadRestore());
  EXPECT_TRUE(health_.ok());
}

TEST_F(JobHealthTest, AFollowerWhoseLeadLostTheJobWaitsUntilTheLeadAnswersOrRestores) {
  health_.LeadLost(absl::NotFoundError("no job j here"));
  EXPECT_TRUE(health_.WaitsForLostLead());
  EXPECT_THAT(health_.status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("restarted without the job")));
  health_.LeadAnswered();
  EXPECT_FALSE(health_.WaitsForLostLead());
  EXPECT_TRUE(health_.ok());

  // While a restore runs, an answer from the lead leaves it to the restore.
  health_.LeadLost(absl::NotFoundError("no job j here"));
  health_.BeginRestore();
  health_.LeadAnswered();
  EXPECT_TRUE(health_.restoring());
  EXPECT_FALSE(health_.ok());

  // A job that already needs a restore does not start waiting for its lead.
  health_.EndRestore(absl::DataLossError("bad part"), "/c/step-3", true);
  health_.LeadLost(absl::NotFoundError("no job j here"));
  EXPECT_FALSE(health_.WaitsForLostLead());
  EXPECT_THAT(health_.status(), StatusIs(absl::StatusCode::kDataLoss, ::testing::_));
}

}  // namespace
}  // namespace zo
