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
// Two more kinds of trouble come at random among the kills:
//   - the disk fills: the checkpoint directory (a small tmpfs, so root is
//     needed; skipped and said otherwise) is filled until a checkpoint
//     fails, sometimes a follower is killed meanwhile (the lead rolls back
//     to the last checkpoint that was written), then space is freed and
//     checkpoints must succeed again, leaving no temporary folders;
//   - a follower is lost under a job that has no checkpoint: a second job
//     trains beside the soak's, a follower is killed, and that job must be
//     failed for good (its worker exits, the lead says NEEDS RESTORE)
//     while the soak's job is rolled back; the operator closes it with
//     zo-ctl and trains it again from the start, with the same losses.
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
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/testing/small_tmpfs.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/chaos/chaos_soak_fixture.h"
#include "tests/cli/zo_ctl_runner.h"
#include "tests/cluster/wait_until.h"
#include "tests/server/server_process.h"
#include "tests/support/child_process.h"

namespace zo::testing::chaos {
namespace {

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

int TemporaryFoldersUnder(const std::string& dir) {
  int n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    n += e.path().extension() == ".tmp";
  }
  return n;
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
  // The checkpoint directory on a disk the soak can fill: room for the
  // checkpoints kept and one being written, many times over.
  SmallTmpfs disk(dir_ + "/chaos/ckpt", "256m");
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
  // Waits for `condition`, meanwhile starting again stage processes that
  // ended (a server or their neighbour died). Threads: a worker that ends
  // has failed.
  const auto wait_for = [&](const std::string& what, const std::function<bool()>& condition) {
    std::vector<const ChildProcess*> producers;
    if (!stage_processes) {
      for (const ChildProcess& w : workers) producers.push_back(&w);
    }
    return cluster::WaitUntil(
        what,
        [&] {
          for (size_t i = 0; stage_processes && i < workers.size(); ++i) {
            if (!workers[i].Wait(std::chrono::milliseconds(0)).has_value()) continue;
            workers[i] = start_worker("chaos", addresses, static_cast<int>(i), 1000000);
            ++stage_restarts;
          }
          return condition();
        },
        dir_ + "/chaos", producers, std::chrono::minutes(4));
  };
  const auto wait_for_step = [&](int64_t step, const char* why) {
    return wait_for(absl::StrCat("both ranks at step ", step, " (", why, ")"), [&] {
      for (int r = 0; r < kRanks; ++r) {
        if (LastStep(Metrics("chaos", r)) < step) return false;
      }
      return true;
    });
  };
  // The lead's status of `job` (zo-ctl status --json); empty when it cannot
  // be read (the lead is starting).
  const auto lead_status = [&](const std::string& job) {
    const ZoCtlResult r =
        RunZoCtl(absl::StrCat("status --json --server ", servers[0].address(), " --job ", job));
    nlohmann::json j =
        r.exit_code == 0 ? nlohmann::json::parse(r.out, nullptr, false) : nlohmann::json();
    return j.is_object() ? j : nlohmann::json::object();
  };
  const auto all_logs = [&] {
    std::string logs;
    for (const ChildProcess& w : workers) absl::StrAppend(&logs, "\n", w.ReadLog());
    for (const ServerProcess& s : servers) absl::StrAppend(&logs, "\n", s.ReadLog());
    return logs;
  };
  const auto kill_follower = [&] {
    const int victim = std::uniform_int_distribution<int>(1, kServers - 1)(rng);
    const int port = servers[victim].port();
    servers[victim].Kill();
    servers[victim] = StartServer("chaos", victim, port, disk_latency_ms());
  };
  int side_jobs = 0;
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
  const auto newest_step = [&] {
    int64_t at = 0;
    for (int r = 0; r < kRanks; ++r) at = std::max(at, LastStep(Metrics("chaos", r)));
    return at;
  };
  // Disk full: until a checkpoint fails; half the time a follower is killed
  // meanwhile. Then space is freed and checkpoints must succeed again.
  const auto fill_the_disk = [&] {
    const int64_t failures = lead_status("chaos").value("checkpoint_failures", int64_t{0});
    ASSERT_TRUE(disk.Fill().ok());
    ASSERT_TRUE(wait_for("a checkpoint fails on the full disk",
                         [&] {
                           return lead_status("chaos").value("checkpoint_failures", int64_t{0}) >
                                  failures;
                         })
                    .ok())
        << all_logs();
    if (std::uniform_int_distribution<int>(0, 1)(rng) == 1) {
      const int64_t at = newest_step();
      const absl::Time killed = absl::Now();
      kill_follower();
      ++kills["follower server, disk full"];
      ASSERT_TRUE(wait_for_step(at + 3, "a follower killed on a full disk").ok()) << all_logs();
      recoveries["follower server, disk full"].push_back(
          absl::ToDoubleSeconds(absl::Now() - killed));
    }
    const int64_t freed_at = newest_step();
    const absl::Time freed = absl::Now();
    disk.Free();
    ASSERT_TRUE(wait_for("checkpoints are written again",
                         [&] {
                           const nlohmann::json st = lead_status("chaos");
                           return st.value("last_checkpoint_step", int64_t{-1}) > freed_at &&
                                  st.value("last_checkpoint_error", std::string("?")).empty();
                         })
                    .ok())
        << all_logs();
    recoveries["disk full"].push_back(absl::ToDoubleSeconds(absl::Now() - freed));
    EXPECT_EQ(TemporaryFoldersUnder(dir_ + "/chaos/ckpt"), 0) << "after a full disk";
  };
  // A follower lost under a job with no checkpoint: that job is failed for
  // good (its worker exits, the lead says so) while the soak's job rolls
  // back; closed with zo-ctl, it trains again from the start, as before.
  // Seconds from the kill to the side job's worker ending.
  std::vector<double> side_job_failed;
  const auto lose_a_job_without_checkpoint = [&] {
    const std::string job = absl::StrCat("side-", ++side_jobs);
    ChildProcess side = StartSideJob(job, addresses, 1000000);
    ASSERT_TRUE(wait_for(job + " at step 3", [&] { return LastStep(SideMetrics(job)) >= 3; }).ok())
        << side.ReadLog();
    const std::vector<std::pair<int64_t, double>> first = Reported(SideMetrics(job));
    const int64_t at = newest_step();
    const absl::Time killed = absl::Now();
    kill_follower();
    ++kills["follower server, beside a job without checkpoint"];
    const std::optional<int> exit = side.Wait(std::chrono::minutes(4));
    ASSERT_TRUE(exit.has_value()) << "the worker of a lost job still runs\n" << side.ReadLog();
    EXPECT_NE(*exit, 0) << side.ReadLog();
    side_job_failed.push_back(absl::ToDoubleSeconds(absl::Now() - killed));
    nlohmann::json st;
    ASSERT_TRUE(wait_for("the lead says " + job + " is lost",
                         [&] {
                           st = lead_status(job);
                           return !st.value("needs_restore", std::string()).empty() &&
                                  !st.value("restoring", false);
                         })
                    .ok())
        << st.dump() << all_logs();
    EXPECT_THAT(st.value("needs_restore", std::string()), ::testing::HasSubstr("is lost"));
    ASSERT_TRUE(wait_for_step(at + 3, "a follower killed beside a job without checkpoint").ok())
        << all_logs();
    recoveries["follower server, beside a job without checkpoint"].push_back(
        absl::ToDoubleSeconds(absl::Now() - killed));

    // What the status tells the operator to do: close it, train it again.
    ZoCtlResult closed =
        RunZoCtl(absl::StrCat("close --server ", servers[0].address(), " --job ", job));
    ASSERT_EQ(closed.exit_code, 0) << closed.out << closed.err;
    std::filesystem::rename(SideMetrics(job), SideMetrics(job) + ".lost");
    ChildProcess again = StartSideJob(job, addresses, 3, ".again");
    ASSERT_EQ(again.Wait(std::chrono::minutes(4)), std::optional<int>(0)) << again.ReadLog();
    const std::vector<std::pair<int64_t, double>> second = Reported(SideMetrics(job));
    ASSERT_EQ(second.size(), 3u) << again.ReadLog();
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(second[i], first[i]) << job << " trained again, step " << i + 1;
    }
    closed = RunZoCtl(absl::StrCat("close --server ", servers[0].address(), " --job ", job));
    ASSERT_EQ(closed.exit_code, 0) << closed.out << closed.err;
  };
  int events = 0;
  while (absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(500, 4000)(rng)));
    // The disk fills first and a job without checkpoint is lost second, so
    // that a short soak meets both; then, one event in 20 loses a job, two
    // in 20 fill the disk, and the others kill one process.
    int event = std::uniform_int_distribution<int>(0, 19)(rng);
    if (events < 2) event = events == 0 ? 1 : 0;
    ++events;
    if (!workers_only && event == 0) {
      lose_a_job_without_checkpoint();
      if (HasFatalFailure()) return;
      continue;
    }
    if (!workers_only && disk.mounted() && (event == 1 || event == 2)) {
      ++kills["disk full"];
      fill_the_disk();
      if (HasFatalFailure()) return;
      continue;
    }
    const int victim = std::uniform_int_distribution<int>(workers_only ? kServers : 0,
                                                          kServers + num_workers - 1)(rng);
    const int64_t at = newest_step();
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
    ASSERT_TRUE(moved.ok()) << moved << "\nafter killing a " << kind << all_logs();
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
        // "at version 48 on ...; resuming" or "at version 48; resuming".
        absl::string_view v = line.substr(at + 12);
        if (absl::SimpleAtoi(v.substr(0, v.find_first_not_of("0123456789")), &n)) {
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
    summary += absl::StrFormat("%s%d %s (%.1f s median, %.1f s worst)", summary.empty() ? "" : ", ",
                               n, what, t.empty() ? 0 : t[t.size() / 2], t.empty() ? 0 : t.back());
    total += n;
  }
  std::sort(side_job_failed.begin(), side_job_failed.end());
  const std::string side_summary =
      side_job_failed.empty()
          ? std::string("no job lost without checkpoint")
          : absl::StrFormat(
                "%d job(s) without checkpoint lost, their workers ending %.1f s (median) "
                "and %.1f s (worst) after the kill, each closed and trained again "
                "with its first losses",
                static_cast<int>(side_job_failed.size()),
                side_job_failed[side_job_failed.size() / 2], side_job_failed.back());
  std::printf(
      "chaos: %d s, seed %u, stages as %s: %d troubles survived (%s; the time is until the job "
      "was 3 steps on, for a full disk until a checkpoint was written again after space was "
      "freed); %s; %s; %d stage processes started again after they ended; %lld steps, %lld "
      "losses equal to the calm run's; rank 0 resumed %lld times, losing %lld steps of work; %d "
      "server starts on a slowed disk; worst server RSS growth %.1f MiB\n",
      seconds, seed, stage_processes ? "processes" : "threads", total, summary.c_str(),
      side_summary.c_str(),
      disk.mounted() ? "checkpoints on a 256 MiB tmpfs" : disk.error().c_str(), stage_restarts,
      static_cast<long long>(steps), static_cast<long long>(compared),
      static_cast<long long>(resumes), static_cast<long long>(lost), slowed_starts,
      worst_rss_growth / double(1 << 20));
}

}  // namespace
}  // namespace zo::testing::chaos
