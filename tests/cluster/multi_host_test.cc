// zo across hosts, with network namespaces as the hosts: three zo-server
// hosts and two zo-train hosts on one switch. Training placed that way must
// be the single-host run bit for bit, and a server host whose cable is
// pulled mid-run must neither hang the job nor be confused with another.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cluster/netns_hosts.h"
#include "tests/cluster/server_host.h"
#include "tests/cluster/wait_until.h"
#include "tests/support/child_process.h"

namespace zo::cluster {
namespace {

using namespace std::chrono_literals;
using testing::ChildProcess;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kServers = 3;
constexpr int kWorkers = 2;

// $ZO_*_PATH, when set, replaces the build's binaries (a copied test run).
std::string Binary(const char* env, const char* built) {
  const char* set = std::getenv(env);
  return set != nullptr ? set : built;
}
std::string ServerBinary() { return Binary("ZO_SERVER_PATH", ZO_SERVER_PATH); }
std::string TrainBinary() { return Binary("ZO_TRAIN_PATH", ZO_TRAIN_PATH); }
std::string CtlBinary() { return Binary("ZO_CTL_PATH", ZO_CTL_PATH); }

// A GPT-lite small enough for 2 cores, cut into chunks of 8000 elements so
// that every one of the three servers holds several.
const std::vector<std::string> kTinyGpt = {"--n-layer", "2", "--n-embd",     "64",
                                           "--n-head",  "4", "--block-size", "32"};
constexpr char kConfig[] =
    R"({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.99], "weight_decay": 0.01}},
  "fp16": {"enabled": true, "initial_scale_power": 12}, "gradient_clipping": 1.0,
  "steps_per_print": 10, "zo": {"chunk_elems": 8000}})";

enum class Parallelism { kData, kPipeline };

// Where each process runs: hosts by index into NetnsHosts.
struct Placement {
  std::vector<int> server_hosts;  // kServers, in striping order (server 0 leads)
  std::vector<int> worker_hosts;  // kWorkers: dp ranks or pipeline stages
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// step -> loss of one worker's --metrics-out (complete lines only: the file
// may be read while zo-train appends to it). Steps without a loss (a first
// pipeline stage) are left out.
std::map<int64_t, double> ReadLosses(const std::string& path) {
  std::map<int64_t, double> losses;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string all = text.str();
  all.erase(all.rfind('\n') == std::string::npos ? 0 : all.rfind('\n') + 1);
  std::istringstream lines(all);
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.at("loss").is_null()) losses[j.at("step").get<int64_t>()] = j.at("loss").get<double>();
  }
  return losses;
}

// Complete lines in a --metrics-out file: the steps reported so far.
int64_t StepsReported(const std::string& metrics) {
  const std::string text = ReadFile(metrics);
  return std::count(text.begin(), text.end(), '\n');
}

// The longest step_s in a --metrics-out file.
double LongestStepSeconds(const std::string& metrics) {
  std::ifstream in(metrics);
  double longest = 0;
  for (std::string line; std::getline(in, line);) {
    longest = std::max(longest, nlohmann::json::parse(line).at("step_s").get<double>());
  }
  return longest;
}

class MultiHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<NetnsHosts>> hosts = NetnsHosts::Create("zot");
    if (hosts.status().code() == absl::StatusCode::kFailedPrecondition) {
      GTEST_SKIP() << hosts.status().message();
    }
    ASSERT_TRUE(hosts.ok()) << hosts.status();
    hosts_ = *std::move(hosts);
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = absl::StrCat(::testing::TempDir(), "/zo_cluster_", test->name(), "_", getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ + "/ds.json") << kConfig;
  }

  int AddHost(const std::string& name) {
    absl::StatusOr<int> host = hosts_->AddHost(name);
    EXPECT_TRUE(host.ok()) << host.status();
    return host.value_or(-1);
  }

  // Three server hosts and two worker hosts.
  Placement MultiHost() {
    Placement p;
    for (int s = 0; s < kServers; ++s) p.server_hosts.push_back(AddHost(absl::StrCat("srv", s)));
    for (int w = 0; w < kWorkers; ++w) p.worker_hosts.push_back(AddHost(absl::StrCat("wrk", w)));
    return p;
  }
  // Every process on one host.
  Placement OneHost() {
    const int host = AddHost("solo");
    return Placement{.server_hosts = std::vector<int>(kServers, host),
                     .worker_hosts = std::vector<int>(kWorkers, host)};
  }

  // Servers on their hosts (several on one host take consecutive ports),
  // each checkpointing under `checkpoints`; their addresses, in order.
  std::vector<std::string> StartServers(const Placement& p, const std::string& checkpoints) {
    std::vector<std::string> addresses;
    std::map<int, int> next_port;
    for (int host : p.server_hosts) {
      const int port = kServerPort + next_port[host]++;
      absl::StatusOr<HostServer> s =
          StartServerOnHost(*hosts_, host, ServerBinary(), dir_,
                            {"--checkpoint-dir", checkpoints, "--threads", "1"}, port);
      EXPECT_TRUE(s.ok()) << s.status();
      if (s.ok()) addresses.push_back(s->address);
    }
    return addresses;
  }

  // zo-train's command line for worker `w` of `job`; `run` names its files.
  std::vector<std::string> TrainArgs(Parallelism parallelism, const Placement& p, int w,
                                     const std::vector<std::string>& servers,
                                     const std::string& job, const std::string& run, int steps) {
    std::vector<std::string> args = {TrainBinary(),
                                     "--config",
                                     dir_ + "/ds.json",
                                     "--steps",
                                     std::to_string(steps),
                                     "--servers",
                                     absl::StrJoin(servers, ","),
                                     "--job",
                                     job,
                                     "--metrics-out",
                                     Metrics(run, w),
                                     "--blas-threads",
                                     "1"};
    args.insert(args.end(), kTinyGpt.begin(), kTinyGpt.end());
    if (parallelism == Parallelism::kData) {
      args.insert(args.end(),
                  {"--dp-rank", std::to_string(w), "--dp-world-size", std::to_string(kWorkers)});
    } else {
      // Stage s listens on its host's address; stages sharing a host take
      // consecutive ports.
      std::vector<std::string> stages;
      for (int s = 0; s < kWorkers; ++s) {
        const int same_host_before = static_cast<int>(
            std::count(p.worker_hosts.begin(), p.worker_hosts.begin() + s, p.worker_hosts[s]));
        stages.push_back(absl::StrCat(hosts_->ip(p.worker_hosts[s]), ":", 6000 + same_host_before));
      }
      args.insert(args.end(), {"--pipeline-stages", std::to_string(kWorkers), "--stage",
                               std::to_string(w), "--stage-addresses", absl::StrJoin(stages, ","),
                               "--partition-method", "type:block"});
    }
    return args;
  }

  std::string Metrics(const std::string& run, int w) const {
    return absl::StrCat(dir_, "/", run, "_worker", w, ".jsonl");
  }

  ChildProcess* StartWorker(const Placement& p, int w, const std::vector<std::string>& args,
                            const std::string& log) {
    absl::StatusOr<ChildProcess*> child = hosts_->Start(p.worker_hosts[w], args, log);
    EXPECT_TRUE(child.ok()) << child.status();
    return child.value_or(nullptr);
  }

  // Starts every worker of `job`; `run` names their files.
  std::vector<ChildProcess*> StartJob(Parallelism parallelism, const Placement& p,
                                      const std::vector<std::string>& servers,
                                      const std::string& job, const std::string& run, int steps) {
    std::vector<ChildProcess*> workers;
    for (int w = 0; w < kWorkers; ++w) {
      workers.push_back(StartWorker(p, w, TrainArgs(parallelism, p, w, servers, job, run, steps),
                                    absl::StrCat(dir_, "/", run, "_worker", w, ".log")));
    }
    return workers;
  }

  // Waits for every worker to exit 0 (at most `limit` in all).
  void ExpectAllSucceed(const std::vector<ChildProcess*>& workers, std::chrono::seconds limit) {
    const auto give_up = std::chrono::steady_clock::now() + limit;
    for (ChildProcess* w : workers) {
      ASSERT_NE(w, nullptr);
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          give_up - std::chrono::steady_clock::now());
      const std::optional<int> code = w->Wait(std::max(left, 0ms));
      ASSERT_TRUE(code.has_value()) << "still running after " << limit.count() << " s:\n"
                                    << w->ReadLog();
      ASSERT_EQ(*code, 0) << w->ReadLog();
    }
  }

  // The cable tests' start, dp ranks placed by `p`: the servers, an
  // uninterrupted run "whole" of kCableSteps, then job "cut" trained to
  // step kCutAfter, when server 1's cable is pulled. Out: the servers and
  // the cut run's workers.
  static constexpr int kCableSteps = 60;
  static constexpr int kCutAfter = 15;
  void TrainWholeThenCutServer1(const Placement& p, std::vector<std::string>& servers,
                                std::vector<ChildProcess*>& workers) {
    servers = StartServers(p, dir_ + "/ckpt");
    ASSERT_EQ(servers.size(), static_cast<size_t>(kServers));
    ExpectAllSucceed(StartJob(Parallelism::kData, p, servers, "whole", "whole", kCableSteps), 60s);
    workers = StartJob(Parallelism::kData, p, servers, "cut", "cut", kCableSteps);
    ASSERT_TRUE(WaitUntil(
                    absl::StrCat("step ", kCutAfter, " in rank 0's metrics"),
                    [&] { return StepsReported(Metrics("cut", 0)) >= kCutAfter; }, dir_,
                    {workers.begin(), workers.end()}, 60s)
                    .ok());
    ASSERT_TRUE(hosts_->SetLink(p.server_hosts[1], false).ok());
  }

  // Every step the cut run reported has the whole run's loss, and each rank
  // reached kCableSteps. A worker that failed or followed the job re-sends
  // the step it was in; that step's line may be missing.
  void ExpectCutRunOnTheWholeRunsTrajectory() {
    for (int w = 0; w < kWorkers; ++w) {
      const std::map<int64_t, double> whole = ReadLosses(Metrics("whole", w));
      const std::map<int64_t, double> cut = ReadLosses(Metrics("cut", w));
      for (const auto& [step, loss] : cut) {
        ASSERT_TRUE(whole.contains(step));
        EXPECT_EQ(loss, whole.at(step)) << "rank " << w << " step " << step;
      }
      EXPECT_GE(cut.size(), static_cast<size_t>(kCableSteps - 2)) << "rank " << w;
      ASSERT_FALSE(cut.empty()) << "rank " << w;
      EXPECT_EQ(cut.rbegin()->first, kCableSteps) << "rank " << w;
    }
  }

  // Trains job "cluster" to `steps` with processes placed by `p`, then
  // checkpoints it with zo-ctl from the first worker's host and exports the
  // fp32 master weights: each worker's losses and the safetensors bytes.
  // `run` names the files of this run.
  struct Outcome {
    std::vector<std::map<int64_t, double>> losses;
    std::string weights;
  };
  Outcome TrainAndExport(Parallelism parallelism, const Placement& p, const std::string& run,
                         int steps) {
    Outcome out;
    const std::string job = "cluster";
    const std::string checkpoints = absl::StrCat(dir_, "/ckpt_", run);
    const std::vector<std::string> servers = StartServers(p, checkpoints);
    if (servers.size() != kServers) return out;
    ExpectAllSucceed(StartJob(parallelism, p, servers, job, run, steps), 60s);
    for (int w = 0; w < kWorkers; ++w) out.losses.push_back(ReadLosses(Metrics(run, w)));
    absl::StatusOr<std::string> saved = hosts_->Run(
        p.worker_hosts[0], {CtlBinary(), "checkpoint", "--server", servers[0], "--job", job});
    EXPECT_TRUE(saved.ok()) << saved.status();
    const std::string exported = absl::StrCat(dir_, "/", run, ".safetensors");
    absl::StatusOr<std::string> written = RunCommand(
        {CtlBinary(), "export", "--checkpoint", checkpoints + "/" + job, "--out", exported});
    EXPECT_TRUE(written.ok()) << written.status();
    out.weights = ReadFile(exported);
    return out;
  }

  std::unique_ptr<NetnsHosts> hosts_;
  std::string dir_;
};

void ExpectSameRun(const auto& multi, const auto& solo, int steps) {
  ASSERT_EQ(multi.losses.size(), solo.losses.size());
  for (size_t w = 0; w < solo.losses.size(); ++w) {
    // Every step's loss, bit for bit: placement must not change a number.
    EXPECT_EQ(multi.losses[w], solo.losses[w]) << "worker " << w;
  }
  EXPECT_EQ(solo.losses.back().size(), static_cast<size_t>(steps));
  EXPECT_FALSE(solo.weights.empty());
  EXPECT_TRUE(multi.weights == solo.weights) << "exported master weights differ";
}

TEST_F(MultiHostTest, DataParallelRanksOnTwoHostsTrainAsOnOneHost) {
  constexpr int kSteps = 12;
  const Outcome solo = TrainAndExport(Parallelism::kData, OneHost(), "solo", kSteps);
  const Outcome multi = TrainAndExport(Parallelism::kData, MultiHost(), "multi", kSteps);
  ExpectSameRun(multi, solo, kSteps);
  // Each rank trains on its own samples: their losses are not one curve.
  EXPECT_NE(solo.losses[0], solo.losses[1]);
}

TEST_F(MultiHostTest, PipelineStagesOnTwoHostsTrainAsOnOneHost) {
  constexpr int kSteps = 12;
  const Outcome solo = TrainAndExport(Parallelism::kPipeline, OneHost(), "solo", kSteps);
  const Outcome multi = TrainAndExport(Parallelism::kPipeline, MultiHost(), "multi", kSteps);
  ExpectSameRun(multi, solo, kSteps);
  EXPECT_TRUE(solo.losses[0].empty());  // the loss lives on the last stage
}

// The cable of server 1 (not the lead) is pulled mid-run for a few seconds
// and plugged back: TCP carries the connections over the gap, the step in
// flight stalls for it, and the job trains on exactly as it would have.
TEST_F(MultiHostTest, ServerCableOutForSecondsStallsOneStepAndTrainingCarriesOn) {
  constexpr auto kCut = 3s;
  const Placement p = MultiHost();
  std::vector<std::string> servers;
  std::vector<ChildProcess*> workers;
  ASSERT_NO_FATAL_FAILURE(TrainWholeThenCutServer1(p, servers, workers));
  // The outage itself lasts kCut; a worker that ends meanwhile cuts it short.
  const absl::Status outage = WaitUntil(
      "the outage", [] { return false; }, dir_, {workers.begin(), workers.end()}, kCut);
  ASSERT_TRUE(hosts_->SetLink(p.server_hosts[1], true).ok());
  EXPECT_EQ(outage.code(), absl::StatusCode::kDeadlineExceeded) << outage;
  ExpectAllSucceed(workers, 60s);

  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_EQ(ReadLosses(Metrics("cut", w)), ReadLosses(Metrics("whole", w))) << "rank " << w;
    EXPECT_EQ(StepsReported(Metrics("cut", w)), kCableSteps);
    // The cut hit a step in flight, which waited for the cable.
    EXPECT_GE(LongestStepSeconds(Metrics("cut", w)), 0.9 * std::chrono::seconds(kCut).count())
        << "rank " << w;
  }
}

// Longer than the TCP_USER_TIMEOUT (20 s) gRPC puts on server sockets: a
// server with bytes unacknowledged all that time drops the connection, and
// the worker learns it when its next retransmission meets the reset, or
// when its own pings go unanswered (rpc/channel.h). A
// worker must then fail naming server 1 (not the lead that waits on it, not
// server 2), and started again with the same command it resumes the job
// (README: a worker that dies re-attaches); or, where no connection was
// dropped, train on. Either way the job ends with the uninterrupted
// trajectory, and nothing hangs.
TEST_F(MultiHostTest, ServerCableOutPastTheTcpTimeoutFailsNamingThatServerAndResumes) {
  constexpr auto kCut = 22s;
  const Placement p = MultiHost();
  std::vector<std::string> servers;
  std::vector<ChildProcess*> workers;
  ASSERT_NO_FATAL_FAILURE(TrainWholeThenCutServer1(p, servers, workers));
  const auto cut_at = std::chrono::steady_clock::now();
  const absl::Status outage = WaitUntil(
      "the outage", [] { return false; }, dir_, {workers.begin(), workers.end()}, kCut);
  ASSERT_TRUE(hosts_->SetLink(p.server_hosts[1], true).ok());
  const auto restored_at = std::chrono::steady_clock::now();
  if (!outage.ok() && outage.code() != absl::StatusCode::kDeadlineExceeded) {
    std::cerr << "a worker ended while the cable was out: " << outage << "\n";
  }

  // Every worker ends 0, or fails once, naming server 1, and is restarted.
  std::vector<int> restarts(kWorkers, 0);
  std::vector<bool> done(kWorkers, false);
  const auto give_up = restored_at + 60s;
  while (std::count(done.begin(), done.end(), true) < kWorkers) {
    std::vector<int> fds;
    for (int w = 0; w < kWorkers; ++w) fds.push_back(done[w] ? -1 : workers[w]->OpenExitFd());
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        give_up - std::chrono::steady_clock::now());
    testing::WaitReadable(fds, std::max(left, 0ms));
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
    bool ended = false;
    for (int w = 0; w < kWorkers; ++w) {
      if (done[w]) continue;
      const std::optional<int> code = workers[w]->Wait(0ms);
      if (!code.has_value()) continue;
      ended = true;
      const double after_cut =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - cut_at).count();
      const std::string log = workers[w]->ReadLog();
      if (*code == 0) {
        done[w] = true;
        continue;
      }
      std::cerr << "rank " << w << " exited " << *code << " " << after_cut << " s after the cut:\n"
                << log.substr(log.rfind("zo-train: step") == std::string::npos
                                  ? 0
                                  : log.rfind("zo-train: step"))
                << "\n";
      EXPECT_THAT(log, HasSubstr("server " + servers[1] + ": ")) << "rank " << w;
      // Another server may be named as a bystander (the lead "stuck" on
      // server 1), never as the one that failed.
      EXPECT_THAT(log, Not(HasSubstr("server " + servers[0] + ": "))) << "rank " << w;
      EXPECT_THAT(log, Not(HasSubstr("server " + servers[2] + ": "))) << "rank " << w;
      ASSERT_EQ(restarts[w]++, 0) << "rank " << w << " failed again after its restart";
      workers[w] =
          StartWorker(p, w, TrainArgs(Parallelism::kData, p, w, servers, "cut", "cut", kCableSteps),
                      absl::StrCat(dir_, "/cut_worker", w, "_restarted.log"));
      ASSERT_NE(workers[w], nullptr);
    }
    ASSERT_TRUE(ended || std::chrono::steady_clock::now() < give_up)
        << "hung: still running 60 s after the cable was plugged back in:\n"
        << workers[0]->ReadLog() << "\n"
        << workers[1]->ReadLog();
  }

  ExpectCutRunOnTheWholeRunsTrajectory();
}

// A server host that goes silent for long (its cable out, as when the host
// lost power): no reset reaches a worker, and one waiting for that server's
// reply sends nothing for TCP to miss. The channel's pings (rpc/channel.h)
// must tell every worker, which names server 1 and waits for it (zo-train
// waits up to 5 minutes for a lost server); once it is back the job ends on
// the uninterrupted trajectory.
TEST_F(MultiHostTest, ServerGoneSilentIsNoticedByEveryWorkerWhichWaitsForIt) {
  const Placement p = MultiHost();
  std::vector<std::string> servers;
  std::vector<ChildProcess*> workers;
  ASSERT_NO_FATAL_FAILURE(TrainWholeThenCutServer1(p, servers, workers));
  // Pings go every 10 s and are given 20 s: the bound only tells a hang.
  const std::string noticed = "server " + servers[1] + ": ";
  const absl::Status told = WaitUntil(
      "every worker noticing server 1",
      [&] {
        return std::all_of(workers.begin(), workers.end(), [&](ChildProcess* w) {
          const std::string log = w->ReadLog();
          return absl::StrContains(log, noticed) &&
                 absl::StrContains(log, "waiting for the servers");
        });
      },
      dir_, {workers.begin(), workers.end()}, 120s);
  ASSERT_TRUE(hosts_->SetLink(p.server_hosts[1], true).ok());
  ASSERT_TRUE(told.ok()) << told << "\n" << workers[0]->ReadLog() << "\n" << workers[1]->ReadLog();
  for (int w = 0; w < kWorkers; ++w) {
    const std::string log = workers[w]->ReadLog();
    EXPECT_THAT(log, Not(HasSubstr("server " + servers[0] + ": "))) << "rank " << w;
    EXPECT_THAT(log, Not(HasSubstr("server " + servers[2] + ": "))) << "rank " << w;
  }
  ExpectAllSucceed(workers, 120s);

  ExpectCutRunOnTheWholeRunsTrajectory();
}

}  // namespace
}  // namespace zo::cluster
