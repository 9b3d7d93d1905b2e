// A zo-server killed with SIGKILL mid-run and started again at its address
// (as systemd or Kubernetes would): the job rolls back to its last
// checkpoint on every server by itself, the worker waits, saying so, then
// resumes at checkpoint step + 1, and every step's loss equals that of a run
// nothing happened to. Once for a follower (its lead rolls back), once for
// the lead (the worker holding dp rank 0 restores it).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/server_process.h"
#include "tests/support/child_process.h"
#include "tests/train/train_run.h"

namespace zo::testing {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

using ServerLossTest = RunningJobTest;

void KillAndRestartMidRun(ServerLossTest& t, int victim) {
  std::vector<ServerProcess> servers;
  for (int i = 0; i < 2; ++i) servers.push_back(t.StartServer());
  ChildProcess train = t.StartTrain(Join(servers, {0, 1}), {"--checkpoint-every", "5"});
  // Past the checkpoint of step 10, inside the next interval.
  ASSERT_TRUE(WaitForSteps(t.metrics(), 13, train)) << train.ReadLog();
  const int port = servers[victim].port();
  servers[victim].Kill();
  servers[victim] = t.StartServer(port);

  t.ExpectTheReferenceTrajectory(train);
  const std::string log = train.ReadLog();
  EXPECT_THAT(log, HasSubstr(servers[victim].address()));
  // Either it saw the server down and waited, or it only met the rollback.
  EXPECT_THAT(log,
              ::testing::AnyOf(HasSubstr("waiting for"), HasSubstr("(restored); following it")));
  EXPECT_THAT(log, ContainsRegex("is at version (10|15) on .*; resuming at step (11|16)"));
}

TEST_F(ServerLossTest, AFollowerKilledAndRestartedRollsTheJobBackByItself) {
  KillAndRestartMidRun(*this, 1);
}

TEST_F(ServerLossTest, TheLeadKilledAndRestartedIsRestoredByTheWorker) {
  KillAndRestartMidRun(*this, 0);
}

// A follower lost (the job rolls back: a restore on every server), then the
// lead: the restarted lead's own restore must still abort the step the
// follower waits in for the dead lead. Restores were numbered from the
// lead's count, which a restarted lead starts again: it reused the number
// the follower was already at, and the follower went on waiting forever.
TEST_F(ServerLossTest, TheLeadLostAfterAFollowerRollbackIsRestoredToo) {
  std::vector<ServerProcess> servers;
  for (int i = 0; i < 2; ++i) servers.push_back(StartServer());
  ChildProcess train = StartTrain(Join(servers, {0, 1}), {"--checkpoint-every", "5"});
  int steps = 13;
  for (int victim : {1, 0}) {
    ASSERT_TRUE(WaitForSteps(metrics(), steps, train)) << train.ReadLog();
    const int port = servers[victim].port();
    servers[victim].Kill();
    servers[victim] = StartServer(port);
    steps += 9;  // past the next checkpoint, whatever the rollback undid
  }
  ExpectTheReferenceTrajectory(train);
  EXPECT_THAT(train.ReadLog(), HasSubstr("restored it from its latest checkpoint"));
}

}  // namespace
}  // namespace zo::testing
