// zo-train end to end, as users run it: real zo-train processes, real
// zo-server processes, pipeline stages in separate processes over TCP.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/testing/free_port.h"
#include "common/testing/small_tmpfs.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "rpc/error_detail.h"
#include "tests/cluster/wait_until.h"
#include "tests/server/server_process.h"
#include "tests/server/training_harness.h"
#include "tests/support/child_process.h"
#include "worker/data/char_dataset.h"
#include "worker/data/synthetic_source.h"

namespace zo::testing {
namespace {

using namespace std::chrono_literals;

struct StepLine {
  int64_t step = 0;
  std::optional<double> loss;
  double loss_scale = 0;
  std::optional<bool> skipped;
};

std::vector<StepLine> ReadMetrics(const std::string& path) {
  std::vector<StepLine> lines;
  std::ifstream in(path);
  std::string text;
  while (std::getline(in, text)) {
    const nlohmann::json j = nlohmann::json::parse(text);
    StepLine l;
    l.step = j.at("step").get<int64_t>();
    if (!j.at("loss").is_null()) l.loss = j.at("loss").get<double>();
    l.loss_scale = j.at("loss_scale").get<double>();
    if (!j.at("skipped").is_null()) l.skipped = j.at("skipped").get<bool>();
    for (const char* key : {"step_s", "samples_per_s", "tokens_per_s"}) {
      EXPECT_TRUE(j.contains(key)) << key << " missing in " << text;
    }
    lines.push_back(l);
  }
  return lines;
}

// A tiny GPT-lite that learns in seconds on 2 cores.
const std::vector<std::string> kTinyGpt = {"--n-layer", "2", "--n-embd",     "64",
                                           "--n-head",  "4", "--block-size", "32"};

std::string Config(bool dpu, int dpu_warmup = 0) {
  return absl::StrCat(R"({"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.99], "weight_decay": 0.01}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-3,
                  "warmup_num_steps": 10, "warmup_type": "linear"}},
    "fp16": {"enabled": true, "initial_scale_power": 12}, "gradient_clipping": 1.0,
    "steps_per_print": 10, "zo": {"chunk_elems": 30000, "dpu": {"enabled": )",
                      dpu ? "true" : "false", R"(, "warmup_steps": )", dpu_warmup, "}}}");
}

std::string WriteFile(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// $ZO_TRAIN_PATH, when set, replaces the build's binary (a copied test run
// on another machine: deploy/gpu-check.sh runs these with the GPU worker).
std::string TrainBinary() {
  const char* binary = std::getenv("ZO_TRAIN_PATH");
  return binary != nullptr ? binary : ZO_TRAIN_PATH;
}

absl::StatusOr<ChildProcess> StartTrain(std::vector<std::string> args, const std::string& log) {
  args.insert(args.begin(), TrainBinary());
  return ChildProcess::Start(args, log);
}

// zo-train with its stdout on a pipe, as in `zo-train | tee log` (stderr
// goes to `log`). Reading the pipe shows how far it has got, without polling.
class PipedTrain {
 public:
  // `pipe_bytes` > 0 shrinks the pipe: once that much is unread, zo-train
  // blocks on its next progress line and trains no further.
  static absl::StatusOr<std::unique_ptr<PipedTrain>> Start(std::vector<std::string> args,
                                                           const std::string& log,
                                                           int pipe_bytes = 0) {
    args.insert(args.begin(), TrainBinary());
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
    if (pipe_bytes > 0 && fcntl(fds[1], F_SETPIPE_SZ, pipe_bytes) != pipe_bytes) {
      return absl::InternalError(absl::StrCat("cannot make a pipe of ", pipe_bytes, " bytes"));
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    auto p = std::unique_ptr<PipedTrain>(new PipedTrain);
    const int spawned =
        posix_spawn(&p->pid_, args[0].c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    p->fd_ = fds[0];
    if (spawned != 0) return absl::InternalError("posix_spawn failed");
    return p;
  }
  ~PipedTrain() {
    Kill();
    close(fd_);
  }

  // Reads stdout until a line matches `line`; returns everything read. Stops
  // early (no match in the result) when zo-train closes its stdout.
  std::string ReadUntilLine(const std::regex& line) {
    char buf[512];
    for (;;) {
      for (size_t begin = 0, end; (end = out_.find('\n', begin)) != std::string::npos;
           begin = end + 1) {
        if (std::regex_search(out_.substr(begin, end - begin), line)) return out_;
      }
      const ssize_t n = read(fd_, buf, sizeof(buf));
      if (n <= 0) return out_;
      out_.append(buf, static_cast<size_t>(n));
    }
  }
  // Whether zo-train is still running (it has not exited).
  bool Running() {
    int status = 0;
    return pid_ > 0 && waitpid(pid_, &status, WNOHANG) == 0;
  }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  PipedTrain() = default;
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string out_;
};

// Runs zo-train to completion (at most `limit`), expecting exit code 0.
void RunTrain(const std::vector<std::string>& args, const std::string& log,
              std::chrono::seconds limit = 120s) {
  auto p = StartTrain(args, log);
  ASSERT_TRUE(p.ok()) << p.status();
  const std::optional<int> code = p->Wait(limit);
  ASSERT_TRUE(code.has_value()) << "zo-train still running after " << limit.count() << " s:\n"
                                << p->ReadLog();
  ASSERT_EQ(*code, 0) << p->ReadLog();
}

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// tinyshakespeare lives beside the repository (../shared/data), never in it.
std::string ShakespearePath() {
  for (const std::string& candidate :
       {std::string(ZO_SOURCE_DIR) + "/../shared/data/tinyshakespeare.txt",
        std::string("/work/shared/data/tinyshakespeare.txt")}) {
    if (std::filesystem::exists(candidate)) return candidate;
  }
  return "";
}

TEST(ZoTrainE2eTest, EmbeddedGptLearnsFarBelowTheUnigramEntropy) {
  const std::string dir = FreshTempDir("zo_train_embedded");
  const std::string data = ShakespearePath();
  // A model that learned only character frequencies scores the unigram
  // entropy; one that uses context goes below it. Half a nat below
  // (1.44 x 0.5 = 0.72 bits per character) is far beyond noise: the step
  // losses of this run scatter by ~0.05 nats around their trend.
  absl::StatusOr<CharDataset> text = data.empty()
                                         ? CharDataset::FromText(SyntheticText(1 << 20, 1337))
                                         : CharDataset::FromFile(data);
  ASSERT_TRUE(text.ok()) << text.status();
  const double unigram_nats = text->UnigramEntropyBits() * std::log(2.0);
  if (data.empty()) {
    std::cerr << "tinyshakespeare.txt not found beside the repository; training on the "
                 "synthetic text instead\n";
  }
  const std::string metrics = dir + "/metrics.jsonl";
  std::vector<std::string> args = Concat(
      {"--config", WriteFile(dir, "ds.json", Config(false)), "--steps", "150", "--metrics-out",
       metrics, "--checkpoint-every", "75", "--checkpoint-dir", dir + "/ckpt"},
      kTinyGpt);
  if (!data.empty()) args = Concat(args, {"--data", data});
  RunTrain(args, dir + "/train.log");

  const std::vector<StepLine> lines = ReadMetrics(metrics);
  ASSERT_EQ(lines.size(), 150u);
  for (size_t i = 0; i < lines.size(); ++i) {
    ASSERT_EQ(lines[i].step, static_cast<int64_t>(i + 1));
    ASSERT_TRUE(lines[i].loss.has_value());
    ASSERT_TRUE(lines[i].skipped.has_value()) << "step " << lines[i].step;
  }
  // At initialisation every character is about equally likely: ln(vocab).
  EXPECT_NEAR(*lines[0].loss, std::log(static_cast<double>(text->vocab().size())), 0.15);
  double last10 = 0;
  for (size_t i = 140; i < 150; ++i) last10 += *lines[i].loss / 10;
  EXPECT_LT(last10, unigram_nats - 0.5) << "unigram entropy " << unigram_nats << " nats";
  // --checkpoint-every asked the embedded server for committed checkpoints
  // at steps 75 and 150. One asked for at step N holds N or a later version
  // (the lead takes it between steps, when the request has come), so the
  // first may hold a step after 75; the last is of step 150, the last step.
  std::vector<int64_t> written;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/ckpt/zo-train")) {
    const std::string name = entry.path().filename().string();
    ASSERT_TRUE(absl::StartsWith(name, "step-")) << name;
    EXPECT_TRUE(std::filesystem::exists(entry.path() / "checkpoint.json")) << name;
    written.push_back(std::stoll(name.substr(5)));
  }
  std::sort(written.begin(), written.end());
  ASSERT_EQ(written.size(), 2u);
  EXPECT_GE(written[0], 75);
  EXPECT_LT(written[0], 150);
  EXPECT_EQ(written[1], 150);

  // A new process restores the first checkpoint (step v) into its own
  // embedded server and trains steps v+1..v+5 exactly as the first run did.
  const int64_t v = written[0];
  const std::string resumed = dir + "/resumed.jsonl";
  std::vector<std::string> again = args;
  for (size_t i = 0; i + 1 < again.size(); ++i) {
    if (again[i] == "--steps") again[i + 1] = std::to_string(v + 5);
    if (again[i] == "--metrics-out") again[i + 1] = resumed;
  }
  again = Concat(again, {"--restore", absl::StrFormat("%s/ckpt/zo-train/step-%08d", dir, v)});
  RunTrain(again, dir + "/resumed.log");
  const std::vector<StepLine> after = ReadMetrics(resumed);
  ASSERT_EQ(after.size(), 5u);
  for (const StepLine& l : after) {
    ASSERT_TRUE(l.loss.has_value());
    EXPECT_EQ(*l.loss, *lines[l.step - 1].loss) << "step " << l.step;
  }
  EXPECT_EQ(after.front().step, v + 1);
}

TEST(ZoTrainE2eTest, TwoStageProcessesOverTcpFollowTheEmbeddedRun) {
  const std::string dir = FreshTempDir("zo_train_tcp");
  constexpr int kSteps = 30;
  constexpr int kDpuWarmup = 8;  // steps 1..9 compute on the newest weights
  // The single-process reference: embedded server, no DPU.
  const std::string ref_metrics = dir + "/ref.jsonl";
  RunTrain(Concat({"--config", WriteFile(dir, "plain.json", Config(false)), "--steps",
                   std::to_string(kSteps), "--metrics-out", ref_metrics},
                  kTinyGpt),
           dir + "/ref.log");
  const std::vector<StepLine> ref = ReadMetrics(ref_metrics);
  ASSERT_EQ(ref.size(), static_cast<size_t>(kSteps));

  // 2 zo-servers, 2 stage processes talking TCP, DPU after kDpuWarmup.
  std::vector<ServerProcess> servers = StartServers(2);
  ASSERT_EQ(servers.size(), 2u);
  const std::string stages =
      absl::StrCat("127.0.0.1:", FreeLoopbackPort(), ",127.0.0.1:", FreeLoopbackPort());
  const std::string config = WriteFile(dir, "dpu.json", Config(true, kDpuWarmup));
  std::vector<ChildProcess> workers;
  for (int s = 0; s < 2; ++s) {
    auto p = StartTrain(
        Concat({"--config", config, "--steps", std::to_string(kSteps), "--pipeline-stages", "2",
                "--stage", std::to_string(s), "--stage-addresses", stages, "--servers",
                absl::StrCat(servers[0].address(), ",", servers[1].address()), "--job", "tcp",
                "--partition-method", "type:block", "--metrics-out",
                absl::StrCat(dir, "/stage", s, ".jsonl")},
               kTinyGpt),
        absl::StrCat(dir, "/stage", s, ".log"));
    ASSERT_TRUE(p.ok()) << p.status();
    workers.push_back(std::move(*p));
  }
  for (ChildProcess& w : workers) {
    const std::optional<int> code = w.Wait(120s);
    ASSERT_TRUE(code.has_value()) << w.ReadLog();
    ASSERT_EQ(*code, 0) << w.ReadLog();
  }
  EXPECT_THAT(workers[0].ReadLog(), ::testing::HasSubstr("stage 0: layers embed .. h.0"));
  // One host: activations go through the receiver's inbox (the CPU
  // backend's shared memory, CUDA IPC on a GPU), not the socket.
  EXPECT_THAT(workers[0].ReadLog(),
              ::testing::HasSubstr("stage 0 <-> stage 1: tensors through shared memory ("));
  EXPECT_THAT(workers[1].ReadLog(),
              ::testing::HasSubstr("stage 1 <-> stage 0: tensors through shared memory ("));
  // Said once, when DPU is on; the reference run without it says nothing.
  for (ChildProcess& w : workers) {
    const std::string log = w.ReadLog();
    EXPECT_THAT(log, ::testing::HasSubstr("DPU on after step 8: each step computes its gradients "
                                          "on weights one step stale"));
    EXPECT_EQ(log.find("DPU on"), log.rfind("DPU on"));
  }
  std::ifstream ref_log(dir + "/ref.log");
  EXPECT_THAT(std::string(std::istreambuf_iterator<char>(ref_log), {}),
              ::testing::Not(::testing::HasSubstr("DPU on")));
  const std::vector<StepLine> stage0 = ReadMetrics(dir + "/stage0.jsonl");
  const std::vector<StepLine> stage1 = ReadMetrics(dir + "/stage1.jsonl");
  ASSERT_EQ(stage0.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(stage1.size(), static_cast<size_t>(kSteps));
  EXPECT_FALSE(stage0[0].loss.has_value());  // the loss lives on the last stage
  for (int i = 0; i <= kDpuWarmup; ++i) {
    ASSERT_TRUE(stage1[i].loss.has_value());
    // fp16 activations and weights: the two runs may round differently
    // (another summation order of the gradient norm), not more.
    EXPECT_NEAR(*stage1[i].loss, *ref[i].loss, 2e-3 * *ref[i].loss) << "step " << i + 1;
  }
  // After DPU starts the curves part, but the pipeline keeps learning.
  auto mean = [&](int from, int to) {
    double sum = 0;
    for (int i = from; i < to; ++i) sum += *stage1[i].loss;
    return sum / (to - from);
  };
  EXPECT_LT(mean(kSteps - 5, kSteps), mean(kDpuWarmup - 2, kDpuWarmup + 3) - 0.1);
}

// Also while the worker streams its weights (zero_optimization.offload_param
// "cpu"): from a zo-server on this host it reads each layer from the
// server's own copy, through the resend client first and the plain one
// after, and the restart stays on the uninterrupted trajectory too.
TEST(ZoTrainE2eTest, KilledWorkerRestartsFromTheServersVersion) {
  const std::string dir = FreshTempDir("zo_train_restart");
  constexpr int kSteps = 60;
  std::vector<ServerProcess> servers = StartServers(1);
  ASSERT_EQ(servers.size(), 1u);
  for (const bool streamed : {false, true}) {
    SCOPED_TRACE(streamed ? "streamed" : "resident");
    const std::string tag = streamed ? "streamed-" : "";
    // A progress line every step, for the killed run below.
    std::string text = Config(true, 5);
    text.replace(text.find("\"steps_per_print\": 10"), 21, "\"steps_per_print\": 1");
    if (streamed) {
      text.replace(text.find("\"zo\": {"), 0,
                   R"("zero_optimization": {"offload_param": {"device": "cpu"},
                                            "stage3_max_live_parameters": 60000}, )");
    }
    const std::string config = WriteFile(dir, tag + "ds.json", text);
    auto args = [&](const std::string& job, const std::string& metrics) {
      return Concat({"--config", config, "--steps", std::to_string(kSteps), "--servers",
                     servers[0].address(), "--job", tag + job, "--metrics-out", metrics},
                    kTinyGpt);
    };
    // The uninterrupted run, as its own job on the same server.
    RunTrain(args("whole", dir + "/" + tag + "whole.jsonl"), dir + "/" + tag + "whole.log");
    const std::vector<StepLine> whole = ReadMetrics(dir + "/" + tag + "whole.jsonl");
    ASSERT_EQ(whole.size(), static_cast<size_t>(kSteps));

    // Kill -9 once step 16 is printed, then start the same command again. Its
    // stdout is a 4 KiB pipe read no further than that line: zo-train blocks on
    // its progress lines (>= 100 bytes each) before step 16 + 41 < kSteps, so
    // it cannot finish before the kill, however slowly this test runs.
    const std::string metrics = dir + "/" + tag + "killed.jsonl";
    auto first = PipedTrain::Start(args("killed", metrics), dir + "/" + tag + "first.log", 4096);
    ASSERT_TRUE(first.ok()) << first.status();
    const std::string printed = (*first)->ReadUntilLine(std::regex("^step +16/"));
    ASSERT_TRUE((*first)->Running()) << "ended before it was killed:\n" << printed;
    (*first)->Kill();
    const size_t reported = ReadMetrics(metrics).size();
    ASSERT_GE(reported, 12u);  // a step's line waits for its outcome: a step or two behind
    ASSERT_LT(reported, static_cast<size_t>(kSteps));
    RunTrain(args("killed", metrics), dir + "/" + tag + "second.log");

    // The restart attached at the servers' version and went on from there.
    std::ifstream in(dir + "/" + tag + "second.log");
    const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (streamed) {
      EXPECT_THAT(log, ::testing::HasSubstr("stage 0 streams its weights from the servers' own "
                                            "copy, a layer at a time"));
    } else {
      // A zo-server on this host: the region, for the restart too.
      EXPECT_THAT(log, ::testing::HasSubstr(
                           "stage 0 keeps its weights on the device (routes: shared_memory)"));
    }
    std::smatch match;
    ASSERT_TRUE(std::regex_search(log, match,
                                  std::regex("attached to job '" + tag +
                                             "killed' at version (\\d+); resuming at step (\\d+)")))
        << log;
    const int64_t version = std::stoll(match[1]);
    EXPECT_GE(version, static_cast<int64_t>(reported));  // nothing reported is redone
    EXPECT_EQ(std::stoll(match[2]), version + 1);
    const std::vector<StepLine> lines = ReadMetrics(metrics);
    ASSERT_GE(lines.size(), reported + 1);
    // Each step the restarted worker ran has exactly the loss of the
    // uninterrupted run: same servers' state, same data, same weights.
    int checked = 0;
    for (size_t i = reported; i < lines.size(); ++i) {
      const StepLine& l = lines[i];
      ASSERT_GT(l.step, version);
      ASSERT_TRUE(l.loss.has_value());
      EXPECT_EQ(*l.loss, *whole[l.step - 1].loss) << "step " << l.step;
      ++checked;
    }
    EXPECT_EQ(lines.back().step, kSteps);
    EXPECT_GE(checked, kSteps - static_cast<int>(version));
  }

  auto args = [&](const std::string& job, const std::string& metrics) {
    return Concat({"--config", dir + "/ds.json", "--steps", std::to_string(kSteps), "--servers",
                   servers[0].address(), "--job", job, "--metrics-out", metrics},
                  kTinyGpt);
  };
  // Attaching another model to the job is refused with the server's reason.
  std::vector<std::string> other = args("killed", dir + "/other.jsonl");
  other.insert(other.end(), {"--n-layer", "3"});
  auto mismatch = StartTrain(other, dir + "/other.log");
  ASSERT_TRUE(mismatch.ok());
  ASSERT_EQ(mismatch->Wait(60s), std::optional<int>(1)) << mismatch->ReadLog();
  if (!RewordErrorsForTesting()) {
    EXPECT_THAT(mismatch->ReadLog(),
                ::testing::HasSubstr("job killed exists with another description"));
  }
}

// Where the server reads the gradients, the worker writes them (no
// staging copy): in a zo-server's shared region on this host, in the
// embedded server's own buffer; and on the same host it pulls the weights
// out of the region. Every step's loss is the one a server that only
// speaks gRPC gives.
TEST(ZoTrainE2eTest, SameHostAndEmbeddedServersTrainAsOverGrpc) {
  const std::string dir = FreshTempDir("zo_train_same_host");
  constexpr int kSteps = 12;
  std::vector<ServerProcess> shm = StartServers(1);
  std::vector<ServerProcess> grpc = StartServers(1, {"--shared_memory=false"});
  ASSERT_EQ(shm.size(), 1u);
  ASSERT_EQ(grpc.size(), 1u);
  const std::string config = WriteFile(dir, "ds.json", Config(false));
  std::vector<std::vector<StepLine>> runs;
  for (const std::string name : {"grpc", "shm", "embedded"}) {
    std::vector<std::string> args = {
        "--config",  config,      "--steps",       std::to_string(kSteps),     "--job",
        "same-host", "--verbose", "--metrics-out", dir + "/" + name + ".jsonl"};
    if (name != "embedded") {
      args.push_back("--servers");
      args.push_back((name == "shm" ? shm[0] : grpc[0]).address());
    }
    RunTrain(Concat(args, kTinyGpt), dir + "/" + name + ".log");
    std::ifstream in(dir + "/" + name + ".log");
    const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (name == "shm") {
      EXPECT_THAT(log, ::testing::HasSubstr("gradients are written where the server reads them "
                                            "(routes: shared_memory)"));
      EXPECT_THAT(log, ::testing::HasSubstr("weights are pulled where the server writes them"));
    } else if (name == "embedded") {
      EXPECT_THAT(log, ::testing::HasSubstr("gradients are written where the server reads them "
                                            "(routes: in_process)"));
    } else {
      EXPECT_THAT(log, ::testing::HasSubstr("(routes: grpc)"));
      EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("gradients are written where")));
    }
    runs.push_back(ReadMetrics(dir + "/" + name + ".jsonl"));
    ASSERT_EQ(runs.back().size(), static_cast<size_t>(kSteps)) << name;
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    for (int i = 0; i < kSteps; ++i) {
      ASSERT_TRUE(runs[0][i].loss.has_value());
      ASSERT_TRUE(runs[r][i].loss.has_value());
      EXPECT_EQ(*runs[r][i].loss, *runs[0][i].loss)
          << (r == 1 ? "shm" : "embedded") << ", step " << runs[0][i].step;
    }
  }
}

// --restore is safe to give every time (the Kubernetes and Slurm files pass
// it to each process): a job at its latest checkpoint is left as it is, one
// that went on past it is refused and left at its version, and
// --restore-force rolls it back.
TEST(ZoTrainE2eTest, RestoreIsIdempotentAndRollsBackALiveJobOnlyWhenForced) {
  const std::string dir = FreshTempDir("zo_train_restore");
  std::vector<ServerProcess> servers = StartServers(1, {"--checkpoint-dir", dir + "/ckpt"});
  ASSERT_EQ(servers.size(), 1u);
  const std::string config = WriteFile(dir, "ds.json", Config(false));
  auto args = [&](int steps, const std::vector<std::string>& more) {
    return Concat(Concat({"--config", config, "--steps", std::to_string(steps), "--servers",
                          servers[0].address(), "--job", "r", "--checkpoint-every", "10"},
                         kTinyGpt),
                  more);
  };
  auto log_of = [](const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  RunTrain(args(10, {}), dir + "/first.log");  // a checkpoint of step 10

  // At its latest checkpoint: nothing to restore, training goes on.
  RunTrain(args(12, {"--restore", "latest"}), dir + "/again.log");
  EXPECT_THAT(log_of(dir + "/again.log"),
              ::testing::AllOf(
                  ::testing::HasSubstr("job 'r' is at version 10, its latest checkpoint: "
                                       "nothing to restore"),
                  ::testing::HasSubstr("attached to job 'r' at version 10; resuming at step 11")));

  // At version 12, past it: refused, and the job stays where it is.
  auto refused = StartTrain(args(14, {"--restore", "latest"}), dir + "/refused.log");
  ASSERT_TRUE(refused.ok());
  ASSERT_EQ(refused->Wait(60s), std::optional<int>(1)) << refused->ReadLog();
  if (!RewordErrorsForTesting()) {
    EXPECT_THAT(refused->ReadLog(),
                ::testing::HasSubstr("job r is live at version 12, past its latest checkpoint "
                                     "(step 10); restoring would roll it back"));
  }
  RunTrain(args(13, {}), dir + "/plain.log");
  EXPECT_THAT(log_of(dir + "/plain.log"),
              ::testing::HasSubstr("attached to job 'r' at version 12; resuming at step 13"));

  // Forced: back to step 10.
  RunTrain(args(11, {"--restore", "latest", "--restore-force"}), dir + "/forced.log");
  EXPECT_THAT(log_of(dir + "/forced.log"),
              ::testing::AllOf(::testing::HasSubstr("restored job 'r' to version 10"),
                               ::testing::HasSubstr("resuming at step 11")));
}

// Checkpoints into a directory on a disk that fills (a 64 KiB tmpfs): each
// failure is an error line in the server's log, a count and a reason in the
// lead's status; no temporary directory stays behind; training goes on, and
// zo-train exits 1 because the run ended on a failed checkpoint.
TEST(ZoTrainE2eTest, CheckpointsOnAFullDiskFailLoudlyAndLeaveNothingBehind) {
  const std::string dir = FreshTempDir("zo_train_full_disk");
  const std::string ckpt = dir + "/ckpt";
  SmallTmpfs disk(ckpt, "64k");  // too small for one checkpoint
  if (!disk.mounted()) GTEST_SKIP() << disk.error();
  std::vector<ServerProcess> servers = StartServers(1, {"--checkpoint-dir", ckpt});
  ASSERT_EQ(servers.size(), 1u);
  const std::string config = WriteFile(dir, "ds.json", Config(false));
  const std::string metrics = dir + "/full.jsonl";
  auto train =
      StartTrain(Concat({"--config", config, "--steps", "10", "--servers", servers[0].address(),
                         "--job", "full", "--checkpoint-every", "5", "--metrics-out", metrics},
                        kTinyGpt),
                 dir + "/full.log");
  ASSERT_TRUE(train.ok()) << train.status();
  ASSERT_EQ(train->Wait(120s), std::optional<int>(1)) << train->ReadLog();
  EXPECT_EQ(ReadMetrics(metrics).size(), 10u) << "training went on";
  const std::string log = train->ReadLog();
  EXPECT_THAT(log, ::testing::HasSubstr("zo-train: checkpoint of step 5 failed, training goes on"));
  EXPECT_THAT(log, ::testing::HasSubstr("training finished, but the checkpoint of step 10 failed"));

  EXPECT_THAT(servers[0].ReadLog(),
              ::testing::AllOf(::testing::HasSubstr("job full: checkpoint of version 5 failed"),
                               ::testing::HasSubstr("job full: checkpoint of version 10 failed")));
  for (const auto& entry : std::filesystem::recursive_directory_iterator(ckpt)) {
    EXPECT_FALSE(absl::EndsWith(entry.path().string(), ".tmp")) << entry.path();
  }
  auto stub = v1::Offload::NewStub(
      grpc::CreateChannel(servers[0].address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::GetJobStatusRequest request;
  request.set_job("full");
  v1::JobStatus status;
  ASSERT_TRUE(stub->GetJobStatus(&context, request, &status).ok());
  EXPECT_EQ(status.checkpoint_failures(), 2);
  EXPECT_EQ(status.last_checkpoint_step(), -1);
  EXPECT_THAT(status.last_checkpoint_error(), ::testing::StartsWith("step 10: "));
}

// A worker started before its server (a pod that is not ready, a host
// restarting) waits for it, saying so, and trains once it is up.
TEST(ZoTrainE2eTest, AWorkerStartedBeforeItsServerWaitsForIt) {
  const std::string dir = FreshTempDir("zo_train_wait_for_server");
  // A port nothing listens on once this server is gone.
  int port = 0;
  {
    std::vector<ServerProcess> probe = StartServers(1);
    ASSERT_EQ(probe.size(), 1u);
    port = probe[0].port();
  }
  const std::string config = WriteFile(dir, "ds.json", Config(false));
  auto train = StartTrain(Concat({"--config", config, "--steps", "3", "--servers",
                                  absl::StrCat("127.0.0.1:", port), "--job", "early"},
                                 kTinyGpt),
                          dir + "/train.log");
  ASSERT_TRUE(train.ok()) << train.status();
  const absl::Status waiting = cluster::WaitUntil(
      "zo-train saying it waits",
      [&] { return absl::StrContains(train->ReadLog(), "zo-train: waiting for the servers"); }, dir,
      {&*train}, std::chrono::minutes(2));
  ASSERT_TRUE(waiting.ok()) << waiting << train->ReadLog();
  ZO_ASSERT_OK_AND_ASSIGN(ServerProcess server, ServerProcess::Start({}, port));
  ASSERT_EQ(train->Wait(std::chrono::minutes(3)), std::optional<int>(0)) << train->ReadLog();
  EXPECT_THAT(train->ReadLog(), ::testing::ContainsRegex("step +3/3"));
}

// `zo-train | tee log`: stdout is a pipe, which stdio buffers fully. The
// first progress line must come through while zo-train is still training,
// or a killed run leaves no log.
TEST(ZoTrainE2eTest, ProgressLinesReachAPipeWhileTraining) {
  const std::string dir = FreshTempDir("zo_train_pipe");
  // Only step 1 is printed before the end: a few hundred bytes that a
  // 4 KiB stdio buffer would keep until exit, and the run far too long to end.
  std::string config = Config(false);
  config.replace(config.find("\"steps_per_print\": 10"), 21, "\"steps_per_print\": 999999");
  auto train = PipedTrain::Start(
      Concat({"--steps", "1000000", "--config", WriteFile(dir, "ds.json", config)}, kTinyGpt),
      dir + "/stderr.log");
  ASSERT_TRUE(train.ok()) << train.status();
  const std::string out = (*train)->ReadUntilLine(std::regex("^step +1/1000000 \\| loss"));
  EXPECT_TRUE((*train)->Running()) << "zo-train ended before its output was read:\n" << out;
  EXPECT_THAT(out, ::testing::ContainsRegex("step +1/1000000 \\| loss"));
  EXPECT_THAT(out, ::testing::HasSubstr("zo-train: GPT-lite"));
}

TEST(ZoTrainE2eTest, BadFlagsAreNamed) {
  const std::string dir = FreshTempDir("zo_train_flags");
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--model", "cnn"}, "--model must be gpt or mlp, not 'cnn'"},
      {{"--n-embd", "30", "--n-head", "4"}, "n_embd (30) must be a multiple of n_head (4)"},
      {{"--pipeline-stages", "2", "--stage", "1"}, "--stage needs --stage-addresses"},
      {{"--partition-method", "balanced"}, "unknown partition method 'balanced'"},
      {{"--data", dir + "/missing.txt"}, "missing.txt"},
      {{"--config", dir + "/missing.json"}, "--config: cannot open config file " + dir},
      {{"--config", WriteFile(dir, "broken.json", "{\"fp16\": {\"enabled\": true,}")},
       "--config: " + dir + "/broken.json: malformed JSON"},
      {{"--pipeline-stages", "9", "--n-layer", "2"}, "cannot cut 5 layers into 9 pipeline stages"},
      {{"--config",
        WriteFile(dir, "compensated.json",
                  R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
                      "zo": {"dpu": {"enabled": true, "compensation": "worker"},
                             "gradient_accumulation": "servers"}})")},
       "zo.dpu.compensation \"worker\" needs the step's gradients kept here"},
  };
  for (const Case& c : cases) {
    auto p = StartTrain(c.args, dir + "/bad.log");
    ASSERT_TRUE(p.ok());
    const std::optional<int> code = p->Wait(60s);
    ASSERT_TRUE(code.has_value());
    EXPECT_EQ(*code, 1) << c.message;
    EXPECT_THAT(p->ReadLog(), ::testing::HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace zo::testing
