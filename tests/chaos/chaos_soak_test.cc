// Soak under chaos: a job with 2 data-parallel workers (each running 2
// pipeline stages as threads) on 3 servers, optimizer state on NVMe swap
// files, checkpoints every 5 steps. For ZO_CHAOS_SECONDS (default 600), at
// random moments, one process at a time (a server or a worker, chosen at
// random) is killed with SIGKILL and started again as systemd would; the
// next kill waits until the job has moved on. Servers run on slowed disks
// at random (zo-server --inject-nvme-latency: every swap read and write
// takes 5 or 25 ms more; server 1 always starts slowed). Afterwards:
//   - every loss any worker reported, for every step it computed (again,
//     after a rollback), equals that step's loss in a run nothing happened
//     to (bit for bit, per dp rank);
//   - no server leaked descriptors or swap files, and their RSS stayed
//     bounded.
// Prints the kills survived and the steps computed again. Label `chaos`:
// not in the default ctest run (minutes); `ctest --test-dir build/release -L chaos`.
// ZO_CHAOS_STAGES=processes runs each rank's two stages as processes of
// their own over the TCP transport (the shape the Kubernetes and Slurm files
// deploy): a stage process that ends (its server or its neighbour died) is
// started again with its own command, as Kubernetes' restartPolicy does.
// ZO_CHAOS_OPTIMIZER=cpu keeps the optimizer state in RAM instead (the
// servers then serve pulls by rounding the master: server/param_versions.h),
// and ZO_CHAOS_DPU=1 turns the delayed parameter update on (with
// ZO_CHAOS_VICTIMS=workers: a rollback makes a DPU run leave the calm
// run's trajectory, see below).
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/testing/free_port.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cluster/wait_until.h"
#include "tests/server/server_process.h"
#include "tests/server/training_harness.h"
#include "tests/support/child_process.h"

namespace zo::testing {
namespace {

constexpr int kServers = 3;
constexpr int kRanks = 2;
const std::vector<std::string> kModel = {"--n-layer", "2",  "--n-embd",          "64",
                                         "--n-head",  "4",  "--block-size",      "32",
                                         "--seed",    "11", "--pipeline-stages", "2"};
constexpr char kConfig[] = R"({
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}},
  "fp16": {"enabled": true, "initial_scale_power": 12}, "steps_per_print": 1,
  "zero_optimization": {"sub_group_size": 40000,
                        "offload_optimizer": {"device": "nvme", "buffer_count": 3,
                                              "nvme_path": "NVME"}},
  "zo": {"chunk_elems": 16384}})";

// Every (step, loss) a worker reported, in order (steps repeat after a rollback).
std::vector<std::pair<int64_t, double>> Reported(const std::string& path) {
  std::vector<std::pair<int64_t, double>> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j["loss"].is_number()) continue;  // a line cut by SIGKILL
    out.emplace_back(j["step"].get<int64_t>(), j["loss"].get<double>());
  }
  return out;
}

int64_t LastStep(const std::string& path) {
  const auto r = Reported(path);
  int64_t last = 0;
  for (const auto& [step, loss] : r) last = std::max(last, step);
  return last;
}

int OpenFds(pid_t pid) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"))) {
    (void)e;
    ++n;
  }
  return n;
}

int64_t RssBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    int64_t kib = 0;
    std::string digits;
    for (char c : line) {
      if (c >= '0' && c <= '9') digits += c;
    }
    if (absl::SimpleAtoi(digits, &kib)) return kib * 1024;
  }
  return -1;
}

int FilesUnder(const std::string& dir) {
  int n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) n += e.is_regular_file();
  return n;
}

bool StageProcesses() {
  const char* stages = std::getenv("ZO_CHAOS_STAGES");
  return stages != nullptr && std::string(stages) == "processes";
}

class ChaosSoakTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTempDir("chaos_soak");
    // Each server's --nvme-path overrides the config's.
    std::string config = absl::StrReplaceAll(kConfig, {{"NVME", dir_ + "/nvme-unused"}});
    if (const char* device = std::getenv("ZO_CHAOS_OPTIMIZER"); device != nullptr) {
      config = absl::StrReplaceAll(
          config, {{R"("device": "nvme")", absl::StrCat(R"("device": ")", device, "\"")}});
    }
    if (const char* dpu = std::getenv("ZO_CHAOS_DPU"); dpu != nullptr && std::string(dpu) == "1") {
      config = absl::StrReplaceAll(
          config, {{R"("chunk_elems": 16384)",
                    R"("chunk_elems": 16384, "dpu": {"enabled": true, "warmup_steps": 2})"}});
    }
    std::ofstream(dir_ + "/config.json") << config;
  }

  // `nvme_latency_ms` > 0: the server's disk is that much slower per I/O.
  ServerProcess StartServer(const std::string& run, int index, int port = 0,
                            int nvme_latency_ms = 0) {
    const std::string nvme = absl::StrCat(dir_, "/", run, "/nvme", index);
    std::filesystem::create_directories(nvme);
    std::vector<std::string> args = {"--checkpoint-dir",   absl::StrCat(dir_, "/", run, "/ckpt"),
                                     "--nvme-path",        nvme,
                                     "--threads",          "1",
                                     "--keep-checkpoints", "2"};
    if (nvme_latency_ms > 0) {
      args.insert(args.end(), {"--inject-nvme-latency", absl::StrCat(nvme_latency_ms, "ms")});
    }
    absl::StatusOr<ServerProcess> s = ServerProcess::Start(args, port);
    EXPECT_TRUE(s.ok()) << s.status();
    return *std::move(s);
  }

  // `stage` >= 0: that pipeline stage alone, a process of its own.
  ChildProcess StartWorker(const std::string& run, const std::string& servers, int rank,
                           int64_t steps, int stage = -1) {
    std::vector<std::string> args = {
        ZO_TRAIN_PATH,
        "--servers",
        servers,
        "--job",
        "chaos",
        "--config",
        dir_ + "/config.json",
        "--dp-rank",
        std::to_string(rank),
        "--dp-world-size",
        std::to_string(kRanks),
        "--steps",
        std::to_string(steps),
        "--checkpoint-every",
        "5",
        "--metrics-out",
        stage == 0 ? absl::StrCat(Metrics(run, rank), ".stage0") : Metrics(run, rank)};
    args.insert(args.end(), kModel.begin(), kModel.end());
    if (stage >= 0) {
      std::string& addresses = stage_addresses_[{run, rank}];
      if (addresses.empty()) {
        addresses =
            absl::StrCat("127.0.0.1:", FreeLoopbackPort(), ",127.0.0.1:", FreeLoopbackPort());
      }
      args.insert(args.end(), {"--stage", std::to_string(stage), "--stage-addresses", addresses});
    }
    // Appended, not truncated: a restarted worker's log follows the last one's.
    const std::string log = WorkerLog(run, rank, stage);
    std::string before;
    {
      std::ifstream in(log);
      before.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    std::ofstream(absl::StrCat(log, ".before"), std::ios::app) << before;
    absl::StatusOr<ChildProcess> w = ChildProcess::Start(args, log);
    EXPECT_TRUE(w.ok()) << w.status();
    return *std::move(w);
  }

  // The losses: the last stage's.
  std::string Metrics(const std::string& run, int rank) const {
    return absl::StrCat(dir_, "/", run, "/rank", rank, ".jsonl");
  }
  std::string WorkerLog(const std::string& run, int rank, int stage) const {
    return absl::StrCat(dir_, "/", run, "/worker", rank,
                        stage >= 0 ? absl::StrCat("-stage", stage) : "", ".log");
  }

  std::string dir_;
  // Per run and rank, with stage processes: the two stages' addresses.
  std::map<std::pair<std::string, int>, std::string> stage_addresses_;
};

std::string ServerList(const std::vector<ServerProcess>& servers) {
  return absl::StrJoin(Addresses(servers), ",");
}

TEST_F(ChaosSoakTest, KillsAnywhereLeaveTheTrajectoryOfARunWithout) {
  const char* env = std::getenv("ZO_CHAOS_SECONDS");
  const int seconds = env != nullptr ? std::atoi(env) : 600;
  const char* seed_env = std::getenv("ZO_CHAOS_SEED");
  const uint32_t seed = seed_env != nullptr ? std::atoi(seed_env) : 7;
  std::mt19937 rng(seed);
  // ZO_CHAOS_VICTIMS=workers: no server is killed, so nothing is rolled back
  // (what a run with DPU needs to stay exact: a restore resumes it on the
  // restored version, not the one before).
  const char* victims = std::getenv("ZO_CHAOS_VICTIMS");
  const bool workers_only = victims != nullptr && std::string(victims) == "workers";

  // A server's disk: as it is, or slowed by 5 or 25 ms per I/O.
  int slowed_starts = 0;
  const auto disk_latency_ms = [&] {
    const int ms = std::array{0, 5, 25}[std::uniform_int_distribution<int>(0, 2)(rng)];
    slowed_starts += ms > 0;
    return ms;
  };
  std::vector<ServerProcess> servers;
  for (int i = 0; i < kServers; ++i) {
    const int ms = i == 1 ? 25 : disk_latency_ms();
    slowed_starts += i == 1;
    servers.push_back(StartServer("chaos", i, 0, ms));
  }
  const std::string addresses = ServerList(servers);
  // Worker processes: one per rank, or with stage processes one per rank and
  // stage (index rank * 2 + stage).
  const bool stage_processes = StageProcesses();
  const int per_rank = stage_processes ? 2 : 1;
  const auto start_worker = [&](const std::string& run, const std::string& on, int i,
                                int64_t steps) {
    return StartWorker(run, on, i / per_rank, steps, stage_processes ? i % per_rank : -1);
  };
  std::vector<ChildProcess> workers;
  for (int i = 0; i < kRanks * per_rank; ++i) {
    workers.push_back(start_worker("chaos", addresses, i, 1000000));
  }
  int stage_restarts = 0;
  const auto wait_for_step = [&](int64_t step, const char* why) {
    // Threads: a worker that ends has failed. Stage processes end when a
    // server or their neighbour dies, and are started again.
    std::vector<const ChildProcess*> producers;
    if (!stage_processes) {
      for (const ChildProcess& w : workers) producers.push_back(&w);
    }
    return cluster::WaitUntil(
        absl::StrCat("both ranks at step ", step, " (", why, ")"),
        [&] {
          for (size_t i = 0; stage_processes && i < workers.size(); ++i) {
            if (!workers[i].Wait(std::chrono::milliseconds(0)).has_value()) continue;
            workers[i] = start_worker("chaos", addresses, static_cast<int>(i), 1000000);
            ++stage_restarts;
          }
          for (int r = 0; r < kRanks; ++r) {
            if (LastStep(Metrics("chaos", r)) < step) return false;
          }
          return true;
        },
        dir_ + "/chaos", producers, std::chrono::minutes(4));
  };
  ASSERT_TRUE(wait_for_step(12, "warm-up").ok()) << workers[0].ReadLog();
  std::vector<int64_t> rss_start;
  for (const ServerProcess& s : servers) rss_start.push_back(RssBytes(s.pid()));

  // The chaos: one victim at a time; the job must move 3 steps past where
  // it was before the next one.
  std::map<std::string, int> kills;
  // Per kind of kill: seconds from the kill until the job was 3 steps on.
  std::map<std::string, std::vector<double>> recoveries;
  const int num_workers = static_cast<int>(workers.size());
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  while (absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(500, 4000)(rng)));
    const int victim = std::uniform_int_distribution<int>(workers_only ? kServers : 0,
                                                          kServers + num_workers - 1)(rng);
    int64_t at = 0;
    for (int r = 0; r < kRanks; ++r) at = std::max(at, LastStep(Metrics("chaos", r)));
    const absl::Time killed = absl::Now();
    std::string kind;
    if (victim < kServers) {
      const int port = servers[victim].port();
      servers[victim].Kill();
      servers[victim] = StartServer("chaos", victim, port, disk_latency_ms());
      kind = victim == 0 ? "lead server" : "follower server";
    } else {
      const int w = victim - kServers;
      workers[w].Kill();
      workers[w] = start_worker("chaos", addresses, w, 1000000);
      kind = stage_processes ? "stage process" : "worker";
    }
    ++kills[kind];
    const absl::Status moved = wait_for_step(at + 3, "after a kill");
    std::string logs;
    for (const ChildProcess& w : workers) absl::StrAppend(&logs, "\n", w.ReadLog());
    ASSERT_TRUE(moved.ok()) << moved << "\nafter killing a " << kind << logs;
    recoveries[kind].push_back(absl::ToDoubleSeconds(absl::Now() - killed));
  }
  int64_t last = 0;
  for (int r = 0; r < kRanks; ++r) last = std::max(last, LastStep(Metrics("chaos", r)));
  ASSERT_TRUE(wait_for_step(last + 2, "the end").ok());

  // Leaks, while the servers still run: descriptors against a fresh server
  // holding the same job, swap files, RSS.
  int64_t worst_rss_growth = 0;
  for (int i = 0; i < kServers; ++i) {
    const int64_t rss = RssBytes(servers[i].pid());
    worst_rss_growth = std::max(worst_rss_growth, rss - rss_start[i]);
    EXPECT_LT(OpenFds(servers[i].pid()), 200) << "server " << i;
    // The job's swap file(s) and nothing else.
    EXPECT_LE(FilesUnder(absl::StrCat(dir_, "/chaos/nvme", i)), 2) << "server " << i;
  }
  // Restarted servers start over; the others must not grow without bound.
  EXPECT_LT(worst_rss_growth, int64_t{256} << 20);
  for (ChildProcess& w : workers) w.Kill();

  // The run nothing happens to, as far as the chaos run got.
  const int64_t steps = last + 2;
  std::vector<ServerProcess> calm;
  for (int i = 0; i < kServers; ++i) calm.push_back(StartServer("calm", i));
  std::vector<ChildProcess> calm_workers;
  for (int i = 0; i < num_workers; ++i) {
    calm_workers.push_back(start_worker("calm", ServerList(calm), i, steps));
  }
  for (ChildProcess& w : calm_workers) {
    ASSERT_EQ(w.Wait(std::chrono::minutes(10)), 0) << w.ReadLog();
  }
  int64_t compared = 0;
  for (int r = 0; r < kRanks; ++r) {
    std::map<int64_t, double> reference;
    for (const auto& [step, loss] : Reported(Metrics("calm", r))) reference[step] = loss;
    for (const auto& [step, loss] : Reported(Metrics("chaos", r))) {
      if (step > steps) continue;
      ASSERT_TRUE(reference.contains(step)) << "rank " << r << " step " << step;
      EXPECT_EQ(loss, reference[step]) << "rank " << r << " step " << step;
      ++compared;
    }
  }
  // Steps lost: each resume ("at version V; resuming") after the worker
  // had reached step S costs S - V steps of work (rank 0's view).
  int64_t resumes = 0, lost = 0;
  {
    const std::string log = WorkerLog("chaos", 0, stage_processes ? 1 : -1);
    std::ifstream in(log + ".before");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ifstream now(log);
    text.append(std::istreambuf_iterator<char>(now), std::istreambuf_iterator<char>());
    int64_t reached = 0;
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      int64_t n = 0;
      if (absl::ConsumePrefix(&line, "step ")) {
        line = absl::StripLeadingAsciiWhitespace(line);
        if (absl::SimpleAtoi(line.substr(0, line.find('/')), &n)) reached = n;
      } else if (const size_t at = line.find(" at version ");  // "is at" or "attached ... at"
                 at != line.npos && line.find("resuming") != line.npos) {
        absl::string_view v = line.substr(at + 12);
        if (absl::SimpleAtoi(v.substr(0, v.find(' ')), &n)) {
          ++resumes;
          lost += std::max<int64_t>(0, reached - n);
          reached = n;
        }
      }
    }
  }
  std::string summary;
  int total = 0;
  for (auto& [what, n] : kills) {
    std::vector<double>& t = recoveries[what];
    std::sort(t.begin(), t.end());
    summary += absl::StrFormat("%s%d %s (back 3 steps on in %.1f s median, %.1f s worst)",
                               summary.empty() ? "" : ", ", n, what,
                               t.empty() ? 0 : t[t.size() / 2], t.empty() ? 0 : t.back());
    total += n;
  }
  std::printf(
      "chaos: %d s, seed %u, stages as %s: %d kills survived (%s); %d stage processes started "
      "again after they ended; %lld steps, %lld losses equal to the calm run's; rank 0 resumed "
      "%lld times, losing %lld steps of work; %d server starts on a slowed disk; worst server "
      "RSS growth %.1f MiB\n",
      seconds, seed, stage_processes ? "processes" : "threads", total, summary.c_str(),
      stage_restarts, static_cast<long long>(steps), static_cast<long long>(compared),
      static_cast<long long>(resumes), static_cast<long long>(lost), slowed_starts,
      worst_rss_growth / double(1 << 20));
}

}  // namespace
}  // namespace zo::testing
