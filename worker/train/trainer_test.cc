// Train() against an embedded server through an in-process channel, as
// zo-train's default: the loop's own contract (steps, resume, stage threads,
// metrics, refusals), no processes. tests/train covers zo-train as a program.
#include "worker/train/trainer.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "offload/checkpoint/checkpoint_test_util.h"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "server/offload_server.h"

namespace zo::train {
namespace {

using ::testing::HasSubstr;
using testing::IsOk;
using testing::StatusIs;

constexpr char kConfig[] = R"({
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
  "fp16": {"enabled": true, "initial_scale_power": 10}, "steps_per_print": 1})";

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ =
        zo::testing::FreshTestDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    ServerOptions options;
    options.listen = "";
    options.threads = 1;
    ZO_ASSERT_OK_AND_ASSIGN(server_, OffloadServer::Start(options));
  }
  void TearDown() override {
    server_->Shutdown(absl::ZeroDuration());
    std::filesystem::remove_all(root_);
  }

  // A two-layer GPT-lite on synthetic text, every step's metrics to a file.
  TrainOptions Options(const std::string& job, int64_t steps, int stages = 1) {
    TrainOptions o;
    o.config_json = kConfig;
    o.gpt = {.n_layer = 2, .n_embd = 32, .n_head = 2, .block_size = 16};
    o.pipeline_stages = stages;
    o.channels = {server_->InProcessChannel()};
    o.job = job;
    o.steps = steps;
    o.blas_threads = 1;
    o.metrics_out = root_ + "/" + job + ".jsonl";
    o.out = devnull_;
    return o;
  }

  // The metrics lines Train appended for `job`: step -> loss.
  std::vector<std::pair<int64_t, double>> Losses(const std::string& job) {
    std::ifstream in(root_ + "/" + job + ".jsonl");
    std::vector<std::pair<int64_t, double>> out;
    std::string line;
    while (std::getline(in, line)) {
      const nlohmann::json j = nlohmann::json::parse(line);
      out.emplace_back(j["step"].get<int64_t>(), j["loss"].get<double>());
    }
    return out;
  }

  int64_t Version(const std::string& job) {
    auto stub = v1::Offload::NewStub(server_->InProcessChannel());
    grpc::ClientContext context;
    v1::GetJobStatusRequest r;
    r.set_job(job);
    v1::JobStatus st;
    EXPECT_TRUE(stub->GetJobStatus(&context, r, &st).ok());
    return st.version();
  }

  std::string root_;
  std::unique_ptr<OffloadServer> server_;
  std::FILE* devnull_ = std::fopen("/dev/null", "w");
};

TEST_F(TrainerTest, TrainsToTheStepsAskedAndTheLossFalls) {
  ASSERT_THAT(Train(Options("a", 12)), IsOk());
  EXPECT_EQ(Version("a"), 12);
  const auto losses = Losses("a");
  ASSERT_EQ(losses.size(), 12u);
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_EQ(losses[i].first, static_cast<int64_t>(i) + 1);
    EXPECT_TRUE(std::isfinite(losses[i].second));
  }
  EXPECT_LT(losses.back().second, losses.front().second);
}

// Started again on a job that has trained, the loop resumes at the servers'
// version + 1 and the trajectory is the one an uninterrupted run takes.
TEST_F(TrainerTest, ASecondRunResumesWhereTheServersAre) {
  ASSERT_THAT(Train(Options("whole", 6)), IsOk());
  ASSERT_THAT(Train(Options("split", 3)), IsOk());
  ASSERT_THAT(Train(Options("split", 6)), IsOk());
  EXPECT_EQ(Version("split"), 6);
  EXPECT_EQ(Losses("split"), Losses("whole"));
}

// Two stages as threads of this process compute what one stage does.
TEST_F(TrainerTest, TwoStagesAsThreadsFollowOneStage) {
  ASSERT_THAT(Train(Options("one", 4)), IsOk());
  ASSERT_THAT(Train(Options("two", 4, /*stages=*/2)), IsOk());
  EXPECT_EQ(Losses("two"), Losses("one"));
}

// zo.gradient_accumulation "servers": each of the 2 micro-batches pushes its
// own fp16 gradients, summed in fp32 by the server; "device" sums them in
// fp32 here and rounds the sum once. Only those roundings differ (2^-11
// relative per value), so the losses agree closely, not bitwise; stages
// cut differently change nothing, as with "device".
TEST_F(TrainerTest, GradientsSummedOnTheServersTrainAsGradientsSummedHere) {
  ASSERT_THAT(Train(Options("here", 8)), IsOk());
  const std::string path = root_ + "/servers.log";
  TrainOptions o = Options("servers", 8);
  o.config_json = std::string(kConfig, sizeof(kConfig) - 2) +
                  R"(, "zo": {"gradient_accumulation": "servers"}})";
  o.out = std::fopen(path.c_str(), "w");
  ASSERT_THAT(Train(o), IsOk());
  std::fclose(o.out);
  std::ifstream log(path);
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("gradients summed on the servers (zo.gradient_accumulation): each "
                              "of the 2 micro-batches pushes its own"));
  const auto here = Losses("here"), servers = Losses("servers");
  ASSERT_EQ(servers.size(), here.size());
  for (size_t i = 0; i < here.size(); ++i) {
    EXPECT_NEAR(servers[i].second, here[i].second, 2e-3 * here[i].second) << "step " << i + 1;
  }
  EXPECT_NE(servers, here);  // the per-micro-batch rounding is really there
  TrainOptions two = Options("servers-two-stages", 8, /*stages=*/2);
  two.config_json = o.config_json;
  ASSERT_THAT(Train(two), IsOk());
  EXPECT_EQ(Losses("servers-two-stages"), servers);
}

// fp16 with a loss scale of 2^30: the first steps' gradients overflow 16
// bits, the cast turns them into inf, and every server skips those steps
// and lowers the scale (DeepSpeed's rules, hysteresis 2) until a step
// fits. On a GPU machine this runs on the CUDA backend (--device auto).
TEST_F(TrainerTest, OverflowingStepsAreSkippedAndTheScaleComesDown) {
  TrainOptions o = Options("overflow", 24);
  o.config_json = R"({
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
    "fp16": {"enabled": true, "initial_scale_power": 30}, "steps_per_print": 1})";
  ASSERT_THAT(Train(o), IsOk());
  std::ifstream in(root_ + "/overflow.jsonl");
  std::vector<nlohmann::json> steps;
  std::string line;
  while (std::getline(in, line)) steps.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(steps.size(), 24u);
  EXPECT_TRUE(steps[0]["skipped"].get<bool>());
  EXPECT_EQ(steps[0]["loss_scale"].get<double>(), std::ldexp(1.0, 30));
  EXPECT_LT(steps.back()["loss_scale"].get<double>(), std::ldexp(1.0, 30));
  EXPECT_FALSE(steps.back()["skipped"].get<bool>());
  for (const nlohmann::json& j : steps) EXPECT_TRUE(std::isfinite(j["loss"].get<double>()));
}

TEST_F(TrainerTest, BadOptionsAreNamed) {
  TrainOptions o = Options("bad", 2);
  o.model = "rnn";
  EXPECT_THAT(Train(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--model")));
  o = Options("bad", 2);
  o.schedule = "1f1b";
  o.virtual_chunks = 2;
  EXPECT_THAT(Train(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("interleaved")));
  o = Options("bad", 0);
  EXPECT_THAT(Train(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--steps")));
  o = Options("bad", 2);
  o.config_json = R"({"train_micro_batch_size_per_gpu": 4, "no_such_key": {)";
  EXPECT_FALSE(Train(o).ok());
}

}  // namespace
}  // namespace zo::train
