// The processes of the chaos soak (chaos_soak_test.cc) and where they write:
// its job's config (ZO_CHAOS_OPTIMIZER, ZO_CHAOS_DPU), zo-server processes
// with their own NVMe folders on a run's checkpoint directory, zo-train
// workers (one per dp rank, or with ZO_CHAOS_STAGES=processes one per rank
// and pipeline stage) whose logs outlive their restarts, and a second job
// beside the soak's. A run ("chaos", "calm") is a folder of its own.
#ifndef ZO_TESTS_CHAOS_CHAOS_SOAK_FIXTURE_H_
#define ZO_TESTS_CHAOS_CHAOS_SOAK_FIXTURE_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/server/server_process.h"
#include "tests/support/child_process.h"

namespace zo::testing::chaos {

inline constexpr int kServers = 3;
inline constexpr int kRanks = 2;

// ZO_CHAOS_STAGES=processes: each rank's two stages are processes of their own.
bool StageProcesses();

// The servers' addresses, as --servers takes them.
std::string ServerList(const std::vector<ServerProcess>& servers);

class ChaosSoakTest : public ::testing::Test {
 protected:
  void SetUp() override;

  // `nvme_latency_ms` > 0: the server's disk is that much slower per I/O.
  ServerProcess StartServer(const std::string& run, int index, int port = 0,
                            int nvme_latency_ms = 0);

  // `stage` >= 0: that pipeline stage alone, a process of its own.
  ChildProcess StartWorker(const std::string& run, const std::string& servers, int rank,
                           int64_t steps, int stage = -1);

  // A second job beside the soak's, in one process, with no checkpoint.
  // `log_suffix` tells a second run's log from the first's.
  ChildProcess StartSideJob(const std::string& job, const std::string& servers, int64_t steps,
                            const std::string& log_suffix = "");
  std::string SideMetrics(const std::string& job) const;

  // The losses: the last stage's.
  std::string Metrics(const std::string& run, int rank) const;
  std::string WorkerLog(const std::string& run, int rank, int stage) const;

  std::string dir_;
  // Per run and rank, with stage processes: the two stages' addresses.
  std::map<std::pair<std::string, int>, std::string> stage_addresses_;
};

}  // namespace zo::testing::chaos

#endif  // ZO_TESTS_CHAOS_CHAOS_SOAK_FIXTURE_H_
