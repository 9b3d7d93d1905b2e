// zero_optimization.offload_param and --device-memory-budget end to end: a
// zo-train process (embedded server) that streams its stage's parameters
// through a window of under a third of the model, or through the window
// planned for a budget a quarter of its weights (the peak under it), trains
// exactly as one that keeps every weight on the device, and what it cannot
// honour is refused naming the key or the bytes.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/free_port.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/server_process.h"
#include "tests/support/child_process.h"
#include "tests/train/train_run.h"

namespace zo::testing {
namespace {

using ::testing::HasSubstr;

// About 215 k parameters; a transformer block is about 50 k of them.
const std::vector<std::string> kGpt = {"--n-layer",    "4",  "--n-embd", "64", "--n-head", "4",
                                       "--block-size", "32", "--steps",  "12", "--seed",   "5"};

// Both runs sum gradients on the servers, as streaming needs, so they push
// the same bytes and only the weights' residence differs.
// `zo` adds keys to the "zo" section (after a comma).
std::string Config(const std::string& zero, int micro_batch = 8, const std::string& zo = "",
                   int micro_batches = 2) {
  return absl::StrCat(R"({"train_micro_batch_size_per_gpu": )", micro_batch,
                      R"(, "gradient_accumulation_steps": )", micro_batches, R"(,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
    "bf16": {"enabled": true}, "gradient_clipping": 1.0, "steps_per_print": 5,
    "zero_optimization": )",
                      zero, R"(, "zo": {"chunk_elems": 30000, "gradient_accumulation": "servers")",
                      zo, "}}");
}

struct Ran {
  std::optional<int> code;
  std::string log;  // stdout and stderr
};

Ran Train(const std::string& dir, const std::string& name, const std::string& zero,
          const std::vector<std::string>& gpt = kGpt, int micro_batch = 8,
          const std::string& zo = "") {
  const std::string config = dir + "/" + name + ".json";
  std::ofstream(config) << Config(zero, micro_batch, zo);
  std::vector<std::string> args = {ZO_TRAIN_PATH, "--config", config, "--metrics-out",
                                   dir + "/" + name + ".jsonl"};
  args.insert(args.end(), gpt.begin(), gpt.end());
  absl::StatusOr<ChildProcess> train = ChildProcess::Start(args, dir + "/" + name + ".log");
  EXPECT_TRUE(train.ok()) << train.status();
  if (!train.ok()) return {};
  Ran ran;
  ran.code = train->Wait(std::chrono::minutes(2));
  ran.log = train->ReadLog();
  return ran;
}

TEST(ParamOffloadTest, StreamedParametersTrainExactlyAsResidentOnes) {
  const std::string dir = FreshTempDir("param_offload");
  const Ran resident = Train(dir, "resident", "{}");
  ASSERT_EQ(resident.code, 0) << resident.log;
  const Ran streamed = Train(dir, "streamed", R"({"offload_param": {"device": "cpu"},
                                                 "stage3_max_live_parameters": 60000})");
  ASSERT_EQ(streamed.code, 0) << streamed.log;
  EXPECT_THAT(streamed.log,
              HasSubstr("parameters streamed (zero_optimization.offload_param): each stage keeps "
                        "its weights in host memory (where the servers share this host, their "
                        "own copy, read a layer at a time) and at most 60000 parameters"));
  // The embedded server is in this process: no copy of the weights here.
  EXPECT_THAT(streamed.log,
              HasSubstr("stage 0 streams its weights from the servers' own copy, a layer at a "
                        "time (no copy of its own) (routes: in_process)"));

  const std::vector<double> a = Losses(dir + "/resident.jsonl");
  const std::vector<double> b = Losses(dir + "/streamed.jsonl");
  ASSERT_EQ(a.size(), 12u);
  EXPECT_EQ(b, a);
  EXPECT_LT(a.back(), a.front() - 0.3);  // and it learns
}

// A zo-server the worker reaches over gRPC (its shared-memory route off):
// the stage keeps a host copy, pulled once a step, and trains exactly as
// the resident run against the same server.
TEST(ParamOffloadTest, OverGrpcAHostCopyStreamsExactly) {
  const std::string dir = FreshTempDir("param_offload_grpc");
  absl::StatusOr<ServerProcess> server = ServerProcess::Start({"--shared-memory=false"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto run = [&](const std::string& name, const std::string& zero) {
    const std::string config = dir + "/" + name + ".json";
    std::ofstream(config) << Config(zero);
    std::vector<std::string> args = {ZO_TRAIN_PATH, "--config",        config,
                                     "--servers",   server->address(), "--job",
                                     name,          "--metrics-out",   dir + "/" + name + ".jsonl"};
    args.insert(args.end(), kGpt.begin(), kGpt.end());
    absl::StatusOr<ChildProcess> train = ChildProcess::Start(args, dir + "/" + name + ".log");
    EXPECT_TRUE(train.ok()) << train.status();
    if (!train.ok()) return std::string();
    EXPECT_EQ(train->Wait(std::chrono::minutes(2)), 0) << train->ReadLog();
    return train->ReadLog();
  };
  run("resident", "{}");
  const std::string log = run("streamed", R"({"offload_param": {"device": "cpu"},
                                              "stage3_max_live_parameters": 60000})");
  EXPECT_THAT(log, HasSubstr("stage 0 streams its weights from a host copy of its own, pulled "
                             "once a step (routes: grpc)"));
  const std::vector<double> a = Losses(dir + "/resident.jsonl");
  ASSERT_EQ(a.size(), 12u);
  EXPECT_EQ(Losses(dir + "/streamed.jsonl"), a);
}

// offload_param "nvme": the stage's weights go to a file under nvme_path,
// pulled through a buffer of 20 000 parameters (several batches a step),
// and the window reads each layer from there; the losses are the resident
// run's, and the file is gone when the process is. A buffer smaller than a
// parameter is refused naming it.
TEST(ParamOffloadTest, WeightsStreamedFromAFileOnNvmeTrainExactlyAsResidentOnes) {
  // With DPU too: its first steps compute on an unchanged version, which
  // leaves the file and the layers on the device as they are.
  for (const std::string dpu : {"", R"(, "dpu": {"enabled": true, "warmup_steps": 2})"}) {
    SCOPED_TRACE(dpu.empty() ? "without DPU" : "with DPU");
    const std::string dir = FreshTempDir("param_offload_nvme");
    const std::string nvme = FreshTempDir("param_offload_nvme_files");
    const Ran resident = Train(dir, "resident", "{}", kGpt, 8, dpu);
    ASSERT_EQ(resident.code, 0) << resident.log;
    const std::string zero =
        absl::StrCat(R"({"offload_param": {"device": "nvme", "nvme_path": ")", nvme,
                     R"(", "buffer_size": 20000}, "stage3_max_live_parameters": 60000})");
    const Ran streamed = Train(dir, "nvme", zero, kGpt, 8, dpu);
    ASSERT_EQ(streamed.code, 0) << streamed.log;
    EXPECT_THAT(streamed.log, HasSubstr(absl::StrCat(
                                  "each stage keeps its weights in a file under ", nvme,
                                  " (pulled through a buffer of 20000 parameters, read a layer "
                                  "at a time) and at most 60000 parameters")));
    EXPECT_THAT(streamed.log, HasSubstr("stage 0 streams its weights from a file on NVMe"));
    EXPECT_EQ(Losses(dir + "/nvme.jsonl"), Losses(dir + "/resident.jsonl"));
    EXPECT_TRUE(std::filesystem::is_empty(nvme));
  }

  const std::string dir = FreshTempDir("param_offload_nvme");
  const std::string nvme = FreshTempDir("param_offload_nvme_files");
  const std::string small = absl::StrCat(R"({"offload_param": {"device": "nvme", "nvme_path": ")",
                                         nvme, R"(", "buffer_size": 1000}})");
  const Ran refused = Train(dir, "small", small);
  EXPECT_EQ(refused.code, 1);  // at start: no step ran
  EXPECT_THAT(refused.log, ::testing::Not(HasSubstr("step 1")));
  EXPECT_THAT(refused.log, HasSubstr("zero_optimization.offload_param.buffer_size = 1000: "));
  EXPECT_THAT(refused.log, HasSubstr("the pull to NVMe goes through one buffer that must hold "
                                     "the largest parameter"));
}

// Sixteen blocks of about 50 k parameters over one 4-token sequence per
// micro-batch: the
// weights (about 1.6 MB in bf16) dwarf the activations, so a budget of a
// quarter of them holds the step, one block's fp32 gradients and the
// window.
const std::vector<std::string> kDeepGpt = {"--n-layer",
                                           "16",
                                           "--n-embd",
                                           "64",
                                           "--n-head",
                                           "4",
                                           "--block-size",
                                           "4",
                                           "--steps",
                                           "8",
                                           "--seed",
                                           "5",
                                           "--activation-checkpoint-every",
                                           "4"};
constexpr int64_t kBudget = 390 << 10;  // below a quarter of kDeepGpt's weights

// The number after `prefix` in `log`; -1 when it is not there.
int64_t NumberAfter(const std::string& log, const std::string& prefix) {
  const size_t at = log.find(prefix);
  return at == std::string::npos ? -1 : std::stoll(log.substr(at + prefix.size()));
}

// With the delayed parameter update too: its weights, one step stale, take
// the same road.
TEST(ParamOffloadTest, ADeviceMemoryBudgetAQuarterOfTheWeightsTrainsExactly) {
  for (const std::string dpu : {"", R"(, "dpu": {"enabled": true, "warmup_steps": 2})"}) {
    SCOPED_TRACE(dpu.empty() ? "without DPU" : "with DPU");
    const std::string dir = FreshTempDir("param_offload_budget");
    const Ran resident = Train(dir, "resident", "{}", kDeepGpt, /*micro_batch=*/1, dpu);
    ASSERT_EQ(resident.code, 0) << resident.log;
    std::vector<std::string> budget = kDeepGpt;
    budget.insert(budget.end(), {"--device-memory-budget", absl::StrCat(kBudget)});
    const Ran streamed = Train(dir, "budget", "{}", budget, /*micro_batch=*/1, dpu);
    ASSERT_EQ(streamed.code, 0) << streamed.log;

    const int64_t params = NumberAfter(streamed.log, "layers embed .. lm_head (");
    EXPECT_GE(params * 2, 4 * kBudget) << streamed.log;  // bf16 weights
    EXPECT_THAT(streamed.log, HasSubstr("--device-memory-budget: stage 0 gets 390.0 KiB"));
    if (!dpu.empty()) {
      EXPECT_THAT(streamed.log, HasSubstr("DPU on after step 2"));
    }
    const int64_t peak = NumberAfter(streamed.log, "tensors on the device at their peak: ");
    EXPECT_GT(peak, 0) << streamed.log;
    EXPECT_LE(peak, kBudget);
    const std::vector<double> a = Losses(dir + "/resident.jsonl");
    ASSERT_EQ(a.size(), 8u);
    EXPECT_EQ(Losses(dir + "/budget.jsonl"), a);
  }
}

// Two dp ranks of two pipeline stages each, four zo-train processes on a
// zo-server: with a budget every stage streams, and each rank's losses are
// the resident job's. One micro-batch a step: the server sums more than two
// pushes of an element in the order they arrive, so with two micro-batches
// two runs of the same job differ in the last bits (and Adam spreads them).
TEST(ParamOffloadTest, StagesAndDpRanksStreamUnchanged) {
  const std::string dir = FreshTempDir("param_offload_topology");
  absl::StatusOr<ServerProcess> server = ServerProcess::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string config = dir + "/ds.json";
  std::ofstream(config) << Config("{}", /*micro_batch=*/1, "", /*micro_batches=*/1);
  auto run = [&](const std::string& name, const std::vector<std::string>& extra) {
    std::vector<ChildProcess> workers;
    for (int rank = 0; rank < 2; ++rank) {
      const std::string stages =
          absl::StrCat("127.0.0.1:", FreeLoopbackPort(), ",127.0.0.1:", FreeLoopbackPort());
      for (int stage = 0; stage < 2; ++stage) {
        std::vector<std::string> args = {ZO_TRAIN_PATH,
                                         "--config",
                                         config,
                                         "--servers",
                                         server->address(),
                                         "--job",
                                         name,
                                         "--dp-rank",
                                         absl::StrCat(rank),
                                         "--dp-world-size",
                                         "2",
                                         "--pipeline-stages",
                                         "2",
                                         "--stage",
                                         absl::StrCat(stage),
                                         "--stage-addresses",
                                         stages,
                                         "--partition-method",
                                         "type:block",
                                         "--blas-threads",
                                         "1",
                                         "--metrics-out",
                                         absl::StrCat(dir, "/", name, rank, stage, ".jsonl")};
        args.insert(args.end(), kDeepGpt.begin(), kDeepGpt.end());
        args.insert(args.end(), extra.begin(), extra.end());
        absl::StatusOr<ChildProcess> p =
            ChildProcess::Start(args, absl::StrCat(dir, "/", name, rank, stage, ".log"));
        EXPECT_TRUE(p.ok()) << p.status();
        if (p.ok()) workers.push_back(*std::move(p));
      }
    }
    std::vector<std::string> logs;
    for (ChildProcess& w : workers) {
      EXPECT_EQ(w.Wait(std::chrono::minutes(2)), 0) << w.ReadLog();
      logs.push_back(w.ReadLog());
    }
    return logs;
  };
  run("resident", {});
  const std::vector<std::string> logs =
      run("streamed", {"--device-memory-budget", absl::StrCat(kBudget)});
  ASSERT_EQ(logs.size(), 4u);
  for (int w = 0; w < 4; ++w) {
    EXPECT_THAT(logs[w], HasSubstr(absl::StrCat("--device-memory-budget: stage ", w % 2, " gets")))
        << logs[w];
    EXPECT_LE(NumberAfter(logs[w], "tensors on the device at their peak: "), kBudget) << logs[w];
  }
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<double> a = Losses(absl::StrCat(dir, "/resident", rank, "1.jsonl"));
    ASSERT_EQ(a.size(), 8u);
    EXPECT_EQ(Losses(absl::StrCat(dir, "/streamed", rank, "1.jsonl")), a) << "rank " << rank;
  }
}

TEST(ParamOffloadTest, ABudgetTooSmallIsRefusedWithTheBytesItNeeds) {
  const std::string dir = FreshTempDir("param_offload_small_budget");
  std::vector<std::string> args = kDeepGpt;
  args.insert(args.end(), {"--device-memory-budget", "300KiB"});
  const Ran ran = Train(dir, "small", "{}", args, /*micro_batch=*/1);
  EXPECT_EQ(ran.code, 1) << ran.log;
  EXPECT_THAT(ran.log, HasSubstr("--device-memory-budget: a device memory budget of 307200 bytes "
                                 "(300.0 KiB) is too small for stage 0"));
  EXPECT_THAT(ran.log, HasSubstr("layer h.0 needs 99968 bytes of weights"));
  EXPECT_THAT(ran.log, HasSubstr("give at least "));

  args.back() = "0";
  EXPECT_THAT(Train(dir, "zero", "{}", args, 1).log,
              HasSubstr("--device-memory-budget must be positive"));
}

TEST(ParamOffloadTest, WhatCannotBeHonouredIsRefusedNamingTheKey) {
  const std::string dir = FreshTempDir("param_offload_refused");
  struct Case {
    std::string zero;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"offload_param": {"device": "nvme", "nvme_path": "/nonexistent/zo"}})",
            "zero_optimization.offload_param.nvme_path: "},
           {R"({"offload_param": {"device": "cpu"}, "stage3_max_live_parameters": 1000})",
            "layer embed needs "}}) {
    const Ran ran = Train(dir, "bad", c.zero);
    EXPECT_EQ(ran.code, 1) << c.message;
    EXPECT_THAT(ran.log, HasSubstr(c.message));
  }
  // Gradients summed on the device would keep an fp32 gradient per weight.
  const std::string config = dir + "/device.json";
  std::string text = Config(R"({"offload_param": {"device": "cpu"}})");
  text.replace(text.find("\"servers\""), 9, "\"device\"");
  std::ofstream(config) << text;
  std::vector<std::string> args = {ZO_TRAIN_PATH, "--config", config};
  args.insert(args.end(), kGpt.begin(), kGpt.end());
  absl::StatusOr<ChildProcess> train = ChildProcess::Start(args, dir + "/device.log");
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->Wait(std::chrono::minutes(1)), 1);
  EXPECT_THAT(train->ReadLog(), HasSubstr("zo.gradient_accumulation = \"device\""));
}

}  // namespace
}  // namespace zo::testing
