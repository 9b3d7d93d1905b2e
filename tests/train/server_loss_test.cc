// A zo-server killed with SIGKILL mid-run and started again at its address
// (as systemd or Kubernetes would): the job rolls back to its last
// checkpoint on every server by itself, the worker waits, saying so, then
// resumes at checkpoint step + 1, and every step's loss equals that of a run
// nothing happened to. Once for a follower (its lead rolls back), once for
// the lead (it finds its followers holding the job when the worker reopens
// it, and restores itself); and both again under pipeline stages that are
// processes of their own.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/free_port.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "rpc/error_detail.h"
#include "tests/cluster/wait_until.h"
#include "tests/server/server_process.h"
#include "tests/support/child_process.h"
#include "tests/train/train_run.h"

namespace zo::testing {
namespace {

using ::testing::HasSubstr;

using ServerLossTest = RunningJobTest;

void KillAndRestartMidRun(ServerLossTest& t, int victim) {
  std::vector<ServerProcess> servers;
  for (int i = 0; i < 2; ++i) servers.push_back(t.StartServer());
  ChildProcess train = t.StartTrain(Join(servers, {0, 1}), {"--checkpoint-every", "5"});
  // Past the checkpoint asked for at step 10. Written, not only begun: on a
  // loaded machine it can take several steps, and a kill while it is in
  // flight fails it (the job then goes back to the one before).
  ASSERT_TRUE(WaitForSteps(t.metrics(), 13, train)) << train.ReadLog();
  ASSERT_TRUE(WaitForCheckpoint(t.dir(), "mv", 10, train)) << train.ReadLog();
  const int port = servers[victim].port();
  servers[victim].Kill();
  servers[victim] = t.StartServer(port);

  t.ExpectTheReferenceTrajectory(train);
  const std::string log = train.ReadLog();
  EXPECT_THAT(log, HasSubstr(servers[victim].address()));
  // Either it saw the server down and waited, or it only met the rollback.
  EXPECT_THAT(log,
              ::testing::AnyOf(HasSubstr("waiting for"), HasSubstr("(restored); following it")));
  // Back to a checkpoint committed before the kill, the one asked for at step
  // 10 or a later one (the worker may not have lived to log that it was).
  std::smatch resumed;
  ASSERT_TRUE(std::regex_search(log, resumed,
                                std::regex(R"(is at version (\d+) on .*; resuming at step (\d+))")))
      << log;
  const int64_t version = std::stoll(resumed[1]);
  EXPECT_EQ(std::stoll(resumed[2]), version + 1);
  EXPECT_GE(version, 10);
  EXPECT_THAT(CheckpointsOnDisk(t.dir() + "/ckpt", "mv"), ::testing::Contains(version));
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

// The shape the Slurm and Kubernetes files deploy: each pipeline stage its
// own process, three servers. A server killed and restarted mid-run: the
// stage processes end (a stage in another process may be what failed), and
// started again with their own command they wait while the lead rolls the
// job back (onto the restarted follower, or onto itself), then train on
// from the checkpoint: every step both runs took has the same loss. The
// workers' opens used to re-create a follower's part at version 0 first,
// and the job hung with every server saying "ok"; a restarted lead was
// restored only by a worker that ran every stage.
// `followers_silent`: the lead restarts while its followers do not answer
// (stopped, a partition); it must not create the job at version 0 for the
// stages' opens (it used to decide from whichever followers answered), and
// rolls the job back once they answer.
void KillAServerUnderStageProcesses(int victim, bool followers_silent = false) {
  const std::string dir = FreshTempDir(absl::StrCat("stage_process_server_loss_", victim));
  std::filesystem::create_directories(dir + "/ckpt");
  std::vector<ServerProcess> servers;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<ServerProcess> s = ServerProcess::Start({"--checkpoint-dir", dir + "/ckpt"});
    ASSERT_TRUE(s.ok()) << s.status();
    servers.push_back(*std::move(s));
  }
  const std::string stages =
      absl::StrCat("127.0.0.1:", FreeLoopbackPort(), ",127.0.0.1:", FreeLoopbackPort());
  constexpr int kSteps = 24;
  const auto start_stages = [&](const std::string& run) {
    std::vector<ChildProcess> workers;
    for (int s = 0; s < 2; ++s) {
      std::vector<std::string> args = {ZO_TRAIN_PATH,
                                       "--servers",
                                       Join(servers, {0, 1, 2}),
                                       "--job",
                                       "stages",
                                       "--steps",
                                       std::to_string(kSteps),
                                       "--checkpoint-every",
                                       "5",
                                       "--pipeline-stages",
                                       "2",
                                       "--stage",
                                       std::to_string(s),
                                       "--stage-addresses",
                                       stages,
                                       "--metrics-out",
                                       absl::StrCat(dir, "/", run, s, ".jsonl")};
      args.insert(args.end(), kModel.begin(), kModel.end());
      absl::StatusOr<ChildProcess> w =
          ChildProcess::Start(args, absl::StrCat(dir, "/", run, s, ".log"));
      EXPECT_TRUE(w.ok()) << w.status();
      workers.push_back(*std::move(w));
    }
    return workers;
  };
  // The last stage has the loss; its metrics lines are the steps done.
  std::vector<ChildProcess> first = start_stages("first");
  // The checkpoint asked for at step 10 written, not only begun (a kill
  // while it is in flight fails it, and the job would go back to the one
  // before); stage 0 asks for them. Then the last stage two steps past the
  // newest written, so that the steps after whichever checkpoint the job
  // goes back to are in the first run's metrics. (One asked for at step N
  // holds N or later: another may be written meanwhile, which the
  // assertions below allow.)
  ASSERT_TRUE(WaitForCheckpoint(dir, "stages", 10, first[0])) << first[0].ReadLog();
  const std::vector<int64_t> written = CheckpointsWritten(first[0].ReadLog(), "stages");
  const int64_t newest = *std::max_element(written.begin(), written.end());
  ASSERT_TRUE(WaitForSteps(dir + "/first1.jsonl", std::max<int64_t>(16, newest + 2), first[1]))
      << first[1].ReadLog();
  const int port = servers[victim].port();
  servers[victim].Kill();
  const auto restart = [&] {
    absl::StatusOr<ServerProcess> restarted =
        ServerProcess::Start({"--checkpoint-dir", dir + "/ckpt"}, port);
    ASSERT_TRUE(restarted.ok()) << restarted.status();
    servers[victim] = *std::move(restarted);
  };
  if (!followers_silent) restart();
  for (ChildProcess& w : first) {
    const std::optional<int> code = w.Wait(std::chrono::minutes(3));
    ASSERT_TRUE(code.has_value()) << "a stage process went on without its server\n" << w.ReadLog();
    EXPECT_NE(*code, 0) << w.ReadLog();
  }
  if (followers_silent) {
    for (int f : {1, 2}) ASSERT_EQ(kill(servers[f].pid(), SIGSTOP), 0);
    restart();
  }

  std::vector<ChildProcess> second = start_stages("second");
  if (followers_silent) {
    // A first open of every server has been answered (or timed out).
    ASSERT_TRUE(
        cluster::WaitUntil(
            "stage 0 waits for the servers",
            [&] { return absl::StrContains(second[0].ReadLog(), "waiting for the servers"); }, dir,
            {&second[0]}, std::chrono::minutes(2))
            .ok())
        << second[0].ReadLog();
    auto stub = v1::Offload::NewStub(
        grpc::CreateChannel(servers[0].address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    v1::GetJobStatusRequest request;
    request.set_job("stages");
    v1::JobStatus status;
    const grpc::Status held = stub->GetJobStatus(&context, request, &status);
    EXPECT_EQ(held.error_code(), grpc::StatusCode::NOT_FOUND)
        << "the lead made the job while its followers were silent: version " << status.version();
    for (int f : {1, 2}) ASSERT_EQ(kill(servers[f].pid(), SIGCONT), 0);
  }
  for (ChildProcess& w : second) {
    const std::optional<int> code = w.Wait(std::chrono::minutes(4));
    ASSERT_TRUE(code.has_value()) << w.ReadLog() << servers[0].ReadLog();
    ASSERT_EQ(*code, 0) << w.ReadLog() << servers[0].ReadLog();
  }
  const std::vector<double> before = Losses(dir + "/first1.jsonl");
  std::ifstream in(dir + "/second1.jsonl");
  int64_t resumed_at = 0;
  int64_t last = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    last = j["step"].get<int64_t>();
    if (resumed_at == 0) resumed_at = last;
    if (last <= static_cast<int64_t>(before.size())) {
      EXPECT_EQ(j["loss"].get<double>(), before[last - 1]) << "step " << last;
    }
  }
  // Back to a checkpoint the lead committed before the kill (the one asked
  // for at step 10 or a later one; stage 0 may have ended before it heard),
  // which the first run had passed: the steps since are taken again.
  EXPECT_GE(resumed_at, 11);
  EXPECT_THAT(CheckpointsOnDisk(dir + "/ckpt", "stages"), ::testing::Contains(resumed_at - 1));
  EXPECT_LE(resumed_at, static_cast<int64_t>(before.size()));
  EXPECT_EQ(last, kSteps);
  if (!RewordErrorsForTesting()) {
    EXPECT_THAT(servers[0].ReadLog(),
                HasSubstr(victim == 0 ? "restarted and lost its part of the job at version"
                                      : "after server 1 lost its part"));
  }
}

TEST(StageProcessServerLossTest, AFollowerRestartedUnderStageProcessesIsRolledBackForTheirCommand) {
  KillAServerUnderStageProcesses(1);
}

TEST(StageProcessServerLossTest, ALeadRestartedUnderStageProcessesRestoresItselfForTheirCommand) {
  KillAServerUnderStageProcesses(0);
}

TEST(StageProcessServerLossTest, ALeadRestartedWhileItsFollowersAreSilentWaitsForThem) {
  KillAServerUnderStageProcesses(0, /*followers_silent=*/true);
}

}  // namespace
}  // namespace zo::testing
