// zero_optimization.offload_param end to end: a zo-train process (embedded
// server) that streams its stage's parameters through a window of under a
// third of the model trains exactly as one that keeps every weight on the
// device, and what it cannot honour is refused naming the key.
#include <chrono>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
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
std::string Config(const std::string& zero) {
  return absl::StrCat(R"({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
    "bf16": {"enabled": true}, "gradient_clipping": 1.0, "steps_per_print": 5,
    "zero_optimization": )",
                      zero,
                      R"(, "zo": {"chunk_elems": 30000, "gradient_accumulation": "servers"}})");
}

struct Ran {
  std::optional<int> code;
  std::string log;  // stdout and stderr
};

Ran Train(const std::string& dir, const std::string& name, const std::string& zero) {
  const std::string config = dir + "/" + name + ".json";
  std::ofstream(config) << Config(zero);
  std::vector<std::string> args = {ZO_TRAIN_PATH, "--config", config, "--metrics-out",
                                   dir + "/" + name + ".jsonl"};
  args.insert(args.end(), kGpt.begin(), kGpt.end());
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
  EXPECT_THAT(streamed.log, HasSubstr("parameters streamed (zero_optimization.offload_param): "
                                      "each stage keeps its weights in host memory and at most "
                                      "60000 parameters"));

  const std::vector<double> a = Losses(dir + "/resident.jsonl");
  const std::vector<double> b = Losses(dir + "/streamed.jsonl");
  ASSERT_EQ(a.size(), 12u);
  EXPECT_EQ(b, a);
  EXPECT_LT(a.back(), a.front() - 0.3);  // and it learns
}

TEST(ParamOffloadTest, WhatCannotBeHonouredIsRefusedNamingTheKey) {
  const std::string dir = FreshTempDir("param_offload_refused");
  struct Case {
    std::string zero;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"offload_param": {"device": "nvme", "nvme_path": "/tmp"}})",
            "zero_optimization.offload_param.device = \"nvme\""},
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
