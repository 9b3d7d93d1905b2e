// What the tests that move or break a running zo-train share: a small
// model, its per-step losses from --metrics-out, waiting for progress.
#ifndef ZO_TESTS_TRAIN_TRAIN_RUN_H_
#define ZO_TESTS_TRAIN_TRAIN_RUN_H_

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cluster/wait_until.h"
#include "tests/server/server_process.h"
#include "tests/server/training_harness.h"
#include "tests/support/child_process.h"

namespace zo::testing {

// Small enough to be quick, slow enough (a few steps a second on 2 cores)
// that a move lands mid-run.
inline const std::vector<std::string> kModel = {
    "--n-layer", "2", "--n-embd", "64", "--n-head", "4", "--block-size", "32", "--seed", "11"};

inline std::vector<double> Losses(const std::string& path) {
  std::vector<double> losses;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j["step"].get<int64_t>(), static_cast<int64_t>(losses.size()) + 1) << line;
    losses.push_back(j["loss"].get<double>());
  }
  return losses;
}

// Waits until the metrics file has `steps` lines (the worker keeps going).
inline bool WaitForSteps(const std::string& path, size_t steps, ChildProcess& train) {
  const absl::Status reached = cluster::WaitUntil(
      absl::StrCat(steps, " steps in ", path),
      [&] {
        std::ifstream in(path);
        size_t lines = 0;
        for (std::string line; std::getline(in, line);) ++lines;
        return lines >= steps;
      },
      std::filesystem::path(path).parent_path().string(), {&train}, std::chrono::minutes(3));
  return reached.ok();
}

// Until `train`'s log (in `dir`) holds `text`.
inline bool WaitForLog(const std::string& dir, const std::string& text, ChildProcess& train) {
  const absl::Status reached = cluster::WaitUntil(
      absl::StrCat("\"", text, "\" in the log"),
      [&] { return train.ReadLog().find(text) != std::string::npos; }, dir, {&train},
      std::chrono::minutes(3));
  return reached.ok();
}

// The versions of `job`'s checkpoints a zo-train log says were written
// ("checkpoint written: <dir>/<job>/step-NNNNNNNN"), in the log's order. A
// checkpoint asked for at step N holds N or a later version (the lead takes
// it between steps, after one still being written), so tests read the
// versions here rather than assume the steps they asked at.
inline std::vector<int64_t> CheckpointsWritten(const std::string& log, const std::string& job) {
  static const std::regex written(R"(checkpoint written: \S*/([^/\s]+)/step-(\d+))");
  std::vector<int64_t> versions;
  for (std::sregex_iterator it(log.begin(), log.end(), written), end; it != end; ++it) {
    if ((*it)[1] == job) versions.push_back(std::stoll((*it)[2]));
  }
  return versions;
}

// The versions of `job`'s committed checkpoints under `root` (the servers'
// --checkpoint-dir): what a job can go back to, whether or not the worker
// that asked for one lived to log it.
inline std::vector<int64_t> CheckpointsOnDisk(const std::string& root, const std::string& job) {
  std::vector<int64_t> versions;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root + "/" + job, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && std::filesystem::exists(entry.path() / "checkpoint.json")) {
      versions.push_back(std::stoll(name.substr(5)));
    }
  }
  std::sort(versions.begin(), versions.end());
  return versions;
}

// Until `train`'s log (in `dir`) says a checkpoint of `job` holding
// `min_version` or later was written.
inline bool WaitForCheckpoint(const std::string& dir, const std::string& job, int64_t min_version,
                              ChildProcess& train) {
  const absl::Status reached = cluster::WaitUntil(
      absl::StrCat("a checkpoint of ", job, " at version ", min_version, " or later"),
      [&] {
        const std::vector<int64_t> v = CheckpointsWritten(train.ReadLog(), job);
        return !v.empty() && *std::max_element(v.begin(), v.end()) >= min_version;
      },
      dir, {&train}, std::chrono::minutes(3));
  return reached.ok();
}

inline std::string Join(const std::vector<ServerProcess>& servers, std::vector<int> which) {
  std::vector<std::string> a;
  for (int i : which) a.push_back(servers[i].address());
  return absl::StrJoin(a, ",");
}

// A zo-train run on real servers that a test moves or breaks, and the
// trajectory of the same run that nothing happens to (the embedded server).
class RunningJobTest : public ::testing::Test {
 public:
  void SetUp() override {
    dir_ = FreshTempDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_ + "/ckpt");
    // The trajectory a job that never moves follows: the embedded server.
    std::vector<std::string> args = {ZO_TRAIN_PATH, "--steps", "40", "--metrics-out",
                                     dir_ + "/ref.jsonl"};
    args.insert(args.end(), kModel.begin(), kModel.end());
    absl::StatusOr<ChildProcess> ref = ChildProcess::Start(args, dir_ + "/ref.log");
    ASSERT_TRUE(ref.ok()) << ref.status();
    ASSERT_EQ(ref->Wait(std::chrono::minutes(3)), 0) << ref->ReadLog();
    reference_ = Losses(dir_ + "/ref.jsonl");
    ASSERT_EQ(reference_.size(), 40u);
  }

  ServerProcess StartServer(int port = 0) {
    absl::StatusOr<ServerProcess> s =
        ServerProcess::Start({"--checkpoint-dir", dir_ + "/ckpt"}, port);
    EXPECT_TRUE(s.ok()) << s.status();
    return *std::move(s);
  }

  // zo-train on `servers`, far more steps than the test watches: it is
  // killed once the first 40 are in.
  ChildProcess StartTrain(const std::string& servers, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {ZO_TRAIN_PATH, "--servers", servers,         "--job",  "mv",
                                     "--steps",     "100000",    "--metrics-out", metrics()};
    args.insert(args.end(), kModel.begin(), kModel.end());
    args.insert(args.end(), extra.begin(), extra.end());
    absl::StatusOr<ChildProcess> train = ChildProcess::Start(args, dir_ + "/train.log");
    EXPECT_TRUE(train.ok()) << train.status();
    return *std::move(train);
  }

  std::string metrics() const { return dir_ + "/train.jsonl"; }
  const std::string& dir() const { return dir_; }

  // The first 40 steps, then the worker stops; they must be the reference's.
  void ExpectTheReferenceTrajectory(ChildProcess& train) {
    ASSERT_TRUE(WaitForSteps(metrics(), 40, train)) << train.ReadLog();
    train.Kill();
    std::vector<double> got = Losses(metrics());
    got.resize(40);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], reference_[i]) << "step " << i + 1 << "\n" << train.ReadLog();
    }
  }

  std::string dir_;
  std::vector<double> reference_;
};

}  // namespace zo::testing

#endif  // ZO_TESTS_TRAIN_TRAIN_RUN_H_
