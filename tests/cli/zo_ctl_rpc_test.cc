// `zo-ctl status`, `zo-ctl checkpoint` and `zo-ctl export`: the real binary
// against no server, and against two real zo-server processes (token
// required, checkpoints on) that dp workers trained a few steps through the
// client library.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/zo/v1/job.pb.h"
#include "rpc/error_detail.h"
#include "tests/cli/safetensors_file.h"
#include "tests/cli/zo_ctl_runner.h"
#include "tests/cluster/wait_until.h"
#include "tests/server/least_squares.h"
#include "tests/server/server_process.h"
#include "tests/server/training_harness.h"

namespace zo::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kToken[] = "s3cret";
constexpr char kJob[] = "ctl";
constexpr int kSteps = 5;

const std::string kConfig = R"({
  "train_batch_size": 2, "train_micro_batch_size_per_gpu": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
  "gradient_clipping": 0.5,
  "zo": {"chunk_elems": 128}
})";

TEST(ZoCtlNoServerTest, StatusSaysWhereNoServerRuns) {
  for (const char* command : {"status", "checkpoint"}) {
    const ZoCtlResult r = RunZoCtl(absl::StrCat(command, " --server 127.0.0.1:1 --job x"));
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE"));
    EXPECT_THAT(r.err, HasSubstr("is zo-server running at 127.0.0.1:1?"));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
    EXPECT_EQ(r.out, "");
  }
}

TEST(ZoCtlNoServerTest, MissingFlagsExitTwo) {
  ZoCtlResult r = RunZoCtl("status --job x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--server HOST:PORT"));
  r = RunZoCtl("checkpoint --server 127.0.0.1:1 --job x --auth-token-file /nonexistent/token");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent/token"));
}

bool JsonToJobStatus(const std::string& json, v1::JobStatus& out) {
  return google::protobuf::util::JsonStringToMessage(json, &out).ok();
}

// Two servers, job "ctl" (fp32, 2 dp ranks) trained steps 1..kSteps; every
// server has version kSteps when SetUp returns.
class ZoCtlRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(::testing::TempDir(), "/zo_ctl_rpc_", getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ + "/ckpt");
    token_file_ = root_ + "/token";
    std::ofstream(token_file_) << kToken << "\n";
    for (int i = 0; i < 2; ++i) {
      ZO_ASSERT_OK_AND_ASSIGN(ServerProcess s,
                              ServerProcess::Start({"--auth-token-file", token_file_,
                                                    "--checkpoint-dir", root_ + "/ckpt"}));
      servers_.push_back(std::move(s));
    }
    ClientOptions options;
    options.auth_token = kToken;
    ZO_ASSERT_OK_AND_ASSIGN(workers_, OpenWorkers(problem_, DType::kFloat32, kJob, kConfig,
                                                  Addresses(servers_), options));
    ASSERT_THAT(workers_[0]->InitWeights(), IsOk());
    ASSERT_THAT(RunSteps(workers_, 1, kSteps), IsOk());
    // Waits until both servers have applied the last step.
    ZO_ASSERT_OK_AND_ASSIGN(weights_, workers_[1]->PullAll(kSteps));
  }
  void TearDown() override {
    workers_.clear();
    servers_.clear();
    fs::remove_all(root_);
  }

  // Server `i` started again at its port with the same flags (as systemd
  // or Kubernetes restart one): empty, without the job.
  void KillAndRestart(int i) {
    const int port = servers_[i].port();
    servers_[i].Kill();
    ZO_ASSERT_OK_AND_ASSIGN(servers_[i], ServerProcess::Start({"--auth-token-file", token_file_,
                                                               "--checkpoint-dir", root_ + "/ckpt"},
                                                              port));
  }

  // The lead's status once `done` holds for it.
  v1::JobStatus WaitForLead(const std::string& what,
                            const std::function<bool(const v1::JobStatus&)>& done) {
    v1::JobStatus seen;
    const absl::Status reached = cluster::WaitUntil(
        what,
        [&] {
          const ZoCtlResult r = RunZoCtl("status --json " + Flags(0));
          if (r.exit_code != 0) return false;
          seen.Clear();
          return JsonToJobStatus(r.out, seen) && done(seen);
        },
        root_, {}, std::chrono::seconds(90));
    EXPECT_THAT(reached, IsOk()) << servers_[0].ReadLog();
    return seen;
  }

  std::string Flags(int server, const std::string& job = kJob) const {
    return absl::StrCat("--server ", servers_[server].address(), " --job ", job,
                        " --auth-token-file ", token_file_);
  }

  const LeastSquares problem_ = LeastSquares::Make({200, 333, 64}, 32, 2, 5);
  std::string root_;
  std::string token_file_;
  std::vector<ServerProcess> servers_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<float> weights_;  // version kSteps, pulled
};

TEST_F(ZoCtlRpcTest, StatusPrintsWhatTheWorkersDid) {
  for (int s = 0; s < 2; ++s) {
    const ZoCtlResult r = RunZoCtl("status " + Flags(s));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, StartsWith(absl::StrCat("job ctl on server ", s, " of 2 (",
                                               servers_[s].address(), ")\n")));
    EXPECT_THAT(r.out, HasSubstr("version          5 (gradients are pushed for step 6)"));
    EXPECT_THAT(r.out, HasSubstr("applied steps    5\n"));
    EXPECT_THAT(r.out, HasSubstr("health           ok"));
    EXPECT_THAT(r.out, HasSubstr("data parallel    2 rank(s)"));
    EXPECT_THAT(r.out, HasSubstr("last checkpoint  none"));
    EXPECT_THAT(r.out, HasSubstr("waiting calls    0 pull(s) for a version to come, 0 push(es)"));
    EXPECT_THAT(r.out, ::testing::ContainsRegex("RAM +[0-9.]+ [KMG]?i?B for this job"));
    EXPECT_EQ(r.err, "");
  }
}

TEST_F(ZoCtlRpcTest, StatusAsJsonMatchesTheJob) {
  int64_t local_elems = 0;
  for (int s = 0; s < 2; ++s) {
    const ZoCtlResult r = RunZoCtl("status --json " + Flags(s));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["job"], kJob);
    EXPECT_EQ(j["version"], kSteps);
    EXPECT_EQ(j["open_step"], kSteps + 1);
    EXPECT_EQ(j["applied_steps"], kSteps);
    EXPECT_EQ(j["server_index"], s);
    EXPECT_EQ(j["num_servers"], 2);
    EXPECT_EQ(j["dp_world_size"], 2);
    EXPECT_EQ(j["total_elems"], problem_.n);
    EXPECT_EQ(j["loss_scale"], 1.0);
    EXPECT_EQ(j["last_skipped"], false);
    EXPECT_EQ(j["needs_restore"], "");
    EXPECT_EQ(j["last_checkpoint_step"], -1);
    EXPECT_EQ(j.size(), static_cast<size_t>(v1::JobStatus::descriptor()->field_count()));
    local_elems += j["local_elems"].get<int64_t>();
  }
  EXPECT_EQ(local_elems, problem_.n) << "the servers' stripes tile the job";
}

TEST_F(ZoCtlRpcTest, ADeadFollowerShowsOnTheLeadWithinSeconds) {
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus before, workers_[0]->client().JobStatus());
  ASSERT_EQ(before.followers_size(), 1);
  EXPECT_EQ(before.followers(0).server(), servers_[1].address());
  EXPECT_EQ(before.followers(0).state(), v1::FollowerState::UP);

  const absl::Time killed = absl::Now();
  servers_[1].Kill();
  v1::FollowerState seen;
  const absl::Status noticed = cluster::WaitUntil(
      "the lead reports its follower unreachable",
      [&] {
        absl::StatusOr<v1::JobStatus> st = workers_[0]->client().JobStatus();
        if (!st.ok() || st->followers_size() != 1) return false;
        seen = st->followers(0);
        return seen.state() == v1::FollowerState::UNREACHABLE;
      },
      root_, {}, std::chrono::seconds(60));
  ASSERT_THAT(noticed, IsOk());
  // The lead asks every 2 s, each call bounded by 2 s.
  std::printf("the lead reported the dead follower after %.1f s\n",
              absl::ToDoubleSeconds(absl::Now() - killed));
  EXPECT_GE(absl::FromUnixMillis(seen.since_unix_ms()), killed - absl::Seconds(1));
  EXPECT_FALSE(seen.error().empty());

  ZoCtlResult r = RunZoCtl("status " + Flags(0));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("health           FOLLOWER DOWN: ",
                                            servers_[1].address(), " UNREACHABLE since ")));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("followers        ", servers_[1].address(),
                                            " UNREACHABLE since ")));
  r = RunZoCtl("status --json " + Flags(0));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["followers"].size(), 1u);
  EXPECT_EQ(j["followers"][0]["state"], "UNREACHABLE");
  EXPECT_EQ(j["followers"][0]["server"], servers_[1].address());
}

TEST_F(ZoCtlRpcTest, AWrongOrMissingTokenIsUnauthenticated) {
  const std::string wrong = root_ + "/wrong_token";
  std::ofstream(wrong) << "guess\n";
  ZoCtlResult r = RunZoCtl(absl::StrCat("status --server ", servers_[0].address(), " --job ", kJob,
                                        " --auth-token-file ", wrong));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("UNAUTHENTICATED"));
  EXPECT_THAT(r.err, HasSubstr("check --auth-token-file"));
  EXPECT_EQ(r.out, "");
  r = RunZoCtl(absl::StrCat("checkpoint --server ", servers_[0].address(), " --job ", kJob));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("UNAUTHENTICATED"));
  EXPECT_FALSE(fs::exists(root_ + "/ckpt/ctl")) << "refused calls write nothing";
}

TEST_F(ZoCtlRpcTest, AnUnknownJobIsNamed) {
  for (const char* command : {"status", "checkpoint"}) {
    const ZoCtlResult r = RunZoCtl(absl::StrCat(command, " ", Flags(0, "nosuchjob")));
    EXPECT_EQ(r.exit_code, 1) << command;
    EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
    EXPECT_THAT(r.err, HasSubstr("nosuchjob"));
    EXPECT_EQ(r.out, "");
  }
}

TEST_F(ZoCtlRpcTest, JobsListsTheJobOnEveryServer) {
  const std::string servers = absl::StrCat(servers_[0].address(), ",", servers_[1].address());
  ZoCtlResult r = RunZoCtl("jobs --server " + servers + " --auth-token-file " + token_file_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("SERVER "));
  for (int s = 0; s < 2; ++s) {
    EXPECT_THAT(r.out, ::testing::ContainsRegex(
                           absl::StrCat(servers_[s].address(), " +ctl +5 ", s, "/2 .* ok\n")));
  }
  r = RunZoCtl("jobs --json --server " + servers + " --auth-token-file " + token_file_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 2u);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(rows[s]["server"], servers_[s].address());
    EXPECT_EQ(rows[s]["job"], kJob);
    EXPECT_EQ(rows[s]["version"], kSteps);
    EXPECT_EQ(rows[s]["servers"],
              nlohmann::json::array({servers_[0].address(), servers_[1].address()}));
  }
  // One server down: the others still listed, the failure named, exit 1.
  servers_[1].Kill();
  r = RunZoCtl("jobs --server " + servers + " --auth-token-file " + token_file_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr(servers_[0].address()));
  EXPECT_THAT(r.err, HasSubstr(servers_[1].address()));
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE"));
}

TEST_F(ZoCtlRpcTest, CloseFreesTheJobOnEveryServerAndOptionallyItsCheckpoints) {
  ASSERT_EQ(RunZoCtl("checkpoint " + Flags(0)).exit_code, 0);
  ASSERT_TRUE(fs::exists(root_ + "/ckpt/ctl/step-00000005"));
  // Named through the follower: it knows the lead.
  ZoCtlResult r = RunZoCtl("close --delete-checkpoints " + Flags(1));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("job ctl closed on 2 of 2 servers"));
  EXPECT_THAT(r.out, HasSubstr("1 checkpoints removed"));
  EXPECT_FALSE(fs::exists(root_ + "/ckpt/ctl"));
  for (int s = 0; s < 2; ++s) {
    r = RunZoCtl("status " + Flags(s));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
  }
  // A worker still attached hears that the job is gone.
  EXPECT_THAT(workers_[0]->PullAll(kSteps).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("ctl")));
  // Closing again names the server that does not have it.
  r = RunZoCtl("close " + Flags(0));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(servers_[0].address()));
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
}

TEST_F(ZoCtlRpcTest, CloseKeepsCheckpointsUnlessAsked) {
  ASSERT_EQ(RunZoCtl("checkpoint " + Flags(0)).exit_code, 0);
  const ZoCtlResult r = RunZoCtl("close --json " + Flags(0));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 2u);
  for (const nlohmann::json& row : rows) {
    EXPECT_EQ(row["closed"], true) << row;
    EXPECT_GT(row["freed_ram_bytes"].get<int64_t>(), 0) << row;
  }
  EXPECT_TRUE(fs::exists(root_ + "/ckpt/ctl/step-00000005/checkpoint.json"));
}

TEST_F(ZoCtlRpcTest, CheckpointOnlyOnTheLead) {
  const ZoCtlResult r = RunZoCtl("checkpoint " + Flags(1));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_THAT(r.err, HasSubstr(servers_[0].address())) << "names the lead";
}

TEST_F(ZoCtlRpcTest, CheckpointThenExportGivesThePulledWeightsBitForBit) {
  ZoCtlResult r = RunZoCtl("checkpoint " + Flags(0));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string prefix = "checkpoint of job ctl committed: version 5 at ";
  ASSERT_THAT(r.out, StartsWith(prefix));
  ASSERT_EQ(r.out.back(), '\n');
  const std::string path = r.out.substr(prefix.size(), r.out.size() - prefix.size() - 1);
  EXPECT_EQ(fs::path(path).lexically_normal(),
            fs::path(root_ + "/ckpt/ctl/step-00000005").lexically_normal());
  EXPECT_TRUE(fs::is_regular_file(path + "/checkpoint.json"));
  EXPECT_TRUE(fs::is_regular_file(path + "/part-00000.zop"));
  EXPECT_TRUE(fs::is_regular_file(path + "/part-00001.zop"));

  r = RunZoCtl("status --json " + Flags(0));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["last_checkpoint_step"], kSteps);

  const std::string out = root_ + "/ctl.safetensors";
  r = RunZoCtl("export --checkpoint " + path + " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("exported 3 tensor(s)"));
  const Safetensors file = ParseSafetensors(out);
  EXPECT_EQ(file.header["__metadata__"]["zo_version"], "5");
  // fp32 job: the weights workers pull are the master weights.
  ExpectFp32Export(file, ManifestOf(problem_, DType::kFloat32), weights_);
}

// zo-ctl restore is idempotent and safe: a job at its latest checkpoint is
// left alone, a live one past it is rolled back only with --force, and only
// the lead runs it.
TEST_F(ZoCtlRpcTest, RestoreRollsALiveJobBackOnlyWhenForced) {
  ZoCtlResult r = RunZoCtl("checkpoint " + Flags(0));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = RunZoCtl("restore " + Flags(0));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "job ctl is at version 5, its latest checkpoint: nothing to restore\n");

  ASSERT_THAT(RunSteps(workers_, kSteps + 1, kSteps + 2), IsOk());
  ASSERT_THAT(workers_[1]->PullAll(kSteps + 2).status(), IsOk());
  r = RunZoCtl("restore " + Flags(0));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("job ctl is live at version 7 (latest checkpoint: step 5)"));
  EXPECT_THAT(r.err, HasSubstr("--force"));
  r = RunZoCtl("restore " + Flags(1));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(servers_[0].address())) << "names the lead";

  r = RunZoCtl("restore --force " + Flags(0));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("job ctl restored to version 5 from "));
  EXPECT_THAT(r.out, HasSubstr("step-00000005 on its 2 server(s); its workers resume at step 6"));
  for (int s = 0; s < 2; ++s) {
    r = RunZoCtl("status --json " + Flags(s));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["version"], kSteps) << "server " << s;
    EXPECT_EQ(j["needs_restore"], "") << "server " << s;
  }
}

// Callers that read the job and decided together that it needs a restore
// (every stage process given --restore) restore it once between them.
TEST_F(ZoCtlRpcTest, RestoreOnceRestoresOnceForCallersThatReadTheSameCount) {
  ZoCtlResult r = RunZoCtl("checkpoint " + Flags(0));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_THAT(RunSteps(workers_, kSteps + 1, kSteps + 2), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus seen, workers_[0]->client().JobStatus());
  EXPECT_EQ(seen.restores(), 0);
  ZO_ASSERT_OK_AND_ASSIGN(const v1::RestoreResponse first,
                          workers_[0]->client().RestoreOnce("", seen.restores()));
  EXPECT_FALSE(first.already_restored());
  EXPECT_EQ(first.version(), kSteps);
  ZO_ASSERT_OK_AND_ASSIGN(const v1::RestoreResponse second,
                          workers_[1]->client().RestoreOnce("", seen.restores()));
  EXPECT_TRUE(second.already_restored());
  EXPECT_EQ(second.version(), kSteps);
  EXPECT_EQ(second.path(), "");
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus after, workers_[0]->client().JobStatus());
  EXPECT_EQ(after.restores(), 1);
  EXPECT_EQ(after.version(), kSteps);
  // The job trains on from the one restore, both ranks together.
  EXPECT_THAT(RunSteps(workers_, kSteps + 1, kSteps + 1), IsOk());
}

// A follower that restarts under a job with no checkpoint: the lead says the
// job is lost (never "ok"), no worker re-creates the follower's part at
// version 0, and a checkpoint kept elsewhere brings the job back on both
// servers bit for bit (the lead opens the follower's part for the restore).
TEST_F(ZoCtlRpcTest, AFollowerLostWithoutACheckpointFailsTheJobUntilRestoredByHand) {
  ZoCtlResult r = RunZoCtl("checkpoint " + Flags(0));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Kept elsewhere: the servers' checkpoint directory holds none of the job.
  const std::string kept = root_ + "/kept";
  fs::rename(root_ + "/ckpt/ctl", kept);
  workers_.clear();
  KillAndRestart(1);

  const v1::JobStatus lost = WaitForLead(
      "the lead says the job is lost",
      [](const v1::JobStatus& st) { return !st.needs_restore().empty() && !st.restoring(); });
  EXPECT_THAT(lost.needs_restore(),
              HasSubstr(absl::StrCat("server 1 (", servers_[1].address(),
                                     ") restarted and lost its part of the job at version 5")));
  EXPECT_THAT(lost.needs_restore(), HasSubstr("no committed checkpoint of job ctl"));
  EXPECT_THAT(lost.needs_restore(), HasSubstr("zo-ctl restore --job ctl --checkpoint PATH"));
  r = RunZoCtl("status " + Flags(0));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("health           NEEDS RESTORE: server 1 ("));
  EXPECT_THAT(servers_[0].ReadLog(), HasSubstr("the job is lost"));

  // A worker that comes back is refused by name, and creates nothing.
  ClientOptions options;
  options.auth_token = kToken;
  absl::StatusOr<std::vector<std::unique_ptr<Worker>>> again =
      OpenWorkers(problem_, DType::kFloat32, kJob, kConfig, Addresses(servers_), options);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  EXPECT_EQ(ReasonOf(again.status()), v1::ErrorDetail::NEEDS_RESTORE) << again.status();
  EXPECT_THAT(again.status().message(), HasSubstr("lost its part"));
  r = RunZoCtl("status " + Flags(1));
  EXPECT_EQ(r.exit_code, 1) << "the restarted follower holds no part at version 0";
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));

  r = RunZoCtl("restore " + Flags(0) + " --checkpoint " + kept + "/step-00000005");
  ASSERT_EQ(r.exit_code, 0) << r.err << servers_[0].ReadLog();
  EXPECT_THAT(r.out, HasSubstr("job ctl restored to version 5"));
  ZO_ASSERT_OK_AND_ASSIGN(workers_, OpenWorkers(problem_, DType::kFloat32, kJob, kConfig,
                                                Addresses(servers_), options));
  EXPECT_EQ(workers_[0]->client().version(), kSteps);
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<float> restored, workers_[1]->PullAll(kSteps));
  ASSERT_EQ(restored.size(), weights_.size());
  EXPECT_EQ(std::memcmp(restored.data(), weights_.data(), weights_.size() * sizeof(float)), 0);
  // And it trains on.
  EXPECT_THAT(RunSteps(workers_, kSteps + 1, kSteps + 1), IsOk());
}

}  // namespace
}  // namespace zo::testing
