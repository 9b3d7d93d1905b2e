#include "tests/chaos/chaos_soak_fixture.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ios>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/testing/free_port.h"
#include "tests/server/training_harness.h"

namespace zo::testing::chaos {
namespace {

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

}  // namespace

bool StageProcesses() {
  const char* stages = std::getenv("ZO_CHAOS_STAGES");
  return stages != nullptr && std::string(stages) == "processes";
}

std::string ServerList(const std::vector<ServerProcess>& servers) {
  return absl::StrJoin(Addresses(servers), ",");
}

void ChaosSoakTest::SetUp() {
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

ServerProcess ChaosSoakTest::StartServer(const std::string& run, int index, int port,
                                         int nvme_latency_ms) {
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

ChildProcess ChaosSoakTest::StartWorker(const std::string& run, const std::string& servers,
                                        int rank, int64_t steps, int stage) {
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
      addresses = absl::StrCat("127.0.0.1:", FreeLoopbackPort(), ",127.0.0.1:", FreeLoopbackPort());
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

ChildProcess ChaosSoakTest::StartSideJob(const std::string& job, const std::string& servers,
                                         int64_t steps, const std::string& log_suffix) {
  std::vector<std::string> args = {ZO_TRAIN_PATH,
                                   "--servers",
                                   servers,
                                   "--job",
                                   job,
                                   "--config",
                                   dir_ + "/config.json",
                                   "--steps",
                                   std::to_string(steps),
                                   "--metrics-out",
                                   SideMetrics(job)};
  args.insert(args.end(), kModel.begin(), kModel.end());
  absl::StatusOr<ChildProcess> w =
      ChildProcess::Start(args, absl::StrCat(dir_, "/chaos/", job, log_suffix, ".log"));
  EXPECT_TRUE(w.ok()) << w.status();
  return *std::move(w);
}

std::string ChaosSoakTest::SideMetrics(const std::string& job) const {
  return absl::StrCat(dir_, "/chaos/", job, ".jsonl");
}

std::string ChaosSoakTest::Metrics(const std::string& run, int rank) const {
  return absl::StrCat(dir_, "/", run, "/rank", rank, ".jsonl");
}

std::string ChaosSoakTest::WorkerLog(const std::string& run, int rank, int stage) const {
  return absl::StrCat(dir_, "/", run, "/worker", rank,
                      stage >= 0 ? absl::StrCat("-stage", stage) : "", ".log");
}

}  // namespace zo::testing::chaos
