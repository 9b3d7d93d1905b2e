// Runs the real zo-ctl binary the way an operator would and checks its
// figures and its errors.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace zo {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int exit_code;
  std::string output;  // stdout and stderr
};

Result RunZoCtl(const std::string& args) {
  const std::string command = std::string(ZO_CTL_PATH) + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  Result r{-1, ""};
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(ZoCtlEstimateTest, JsonFiguresForAConfigFile) {
  // The example config puts optimizer state on NVMe; flags override the
  // sub-group size. 2e9 params on one server, one dp rank: NVMe 12 B/param,
  // RAM 6 B/param (fp16 gradients as received, two fp16 versions) plus 4
  // buffers of 1e8 elements x 12 B.
  const Result r = RunZoCtl("estimate --params 2B --config " ZO_SOURCE_DIR
                            "/examples/configs/nvme_offload_fp16.json --sub-group-size 1e8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t start = r.output.find('{');
  ASSERT_NE(start, std::string::npos) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output.substr(start));
  EXPECT_EQ(j["optimizer_device"], "nvme");
  EXPECT_EQ(j["server"]["nvme_bytes"], int64_t{24000000000});
  EXPECT_EQ(j["server"]["ram_bytes"], int64_t{12000000000} + 4800000000);
  EXPECT_EQ(j["gpu"]["total_bytes"], int64_t{16000000000});  // 2 + 2 + 4 B per parameter
}

TEST(ZoCtlEstimateTest, TableForAManifest) {
  const std::string manifest = ::testing::TempDir() + "/zo_ctl_manifest.json";
  FILE* f = fopen(manifest.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs(R"({"tensors": [{"name": "a", "shape": [1000, 1000]}, {"name": "b", "shape": [10]}]})", f);
  fclose(f);
  const Result r = RunZoCtl("estimate --manifest " + manifest + " --precision bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("1.00 M parameters in 2 tensor(s), bf16"));
  // Pulls round the master: no stored copy, and with DPU none either (the
  // previous version is recomputed).
  EXPECT_THAT(r.output, Not(HasSubstr("copies for pulls")));
  const Result dpu = RunZoCtl("estimate --manifest " + manifest + " --precision bf16 --dpu");
  ASSERT_EQ(dpu.exit_code, 0) << dpu.output;
  EXPECT_THAT(dpu.output, HasSubstr("bf16 prior version (DPU): recomputed"));
  EXPECT_THAT(dpu.output, Not(HasSubstr("copies for pulls")));
}

// `zo-ctl estimate --params 1B --json` with `zero_optimization` as the
// config's; the JSON it prints.
nlohmann::json EstimateWithZero(const std::string& zero) {
  const std::string config = ::testing::TempDir() + "/zo_ctl_streamed.json";
  std::ofstream(config) << R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true},
                               "zero_optimization": )"
                        << zero << "}";
  const Result r = RunZoCtl("estimate --params 1B --config " + config + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const size_t start = r.output.find('{');
  if (start == std::string::npos) return nlohmann::json::object();
  return nlohmann::json::parse(r.output.substr(start));
}

// offload_param "cpu" in the config, or --max-live-params: a third GPU
// column, the window and one tensor's fp32 gradients.
TEST(ZoCtlEstimateTest, StreamedParametersFromTheConfigOrTheFlag) {
  const nlohmann::json j = EstimateWithZero(
      R"({"offload_param": {"device": "cpu"}, "stage3_max_live_parameters": 1e8})");
  EXPECT_EQ(j["max_live_params"], 100000000);
  EXPECT_EQ(j["gpu_streamed"]["param_bytes"], 200000000);  // fp16
  EXPECT_EQ(j["gpu_streamed"]["next_param_bytes"], 0);
  const Result flag = RunZoCtl("estimate --params 1B --max-live-params 250M");
  ASSERT_EQ(flag.exit_code, 0) << flag.output;
  EXPECT_THAT(flag.output, HasSubstr("and streamed (250.0 M parameters live)"));
  EXPECT_THAT(RunZoCtl("estimate --params 1B").output, Not(HasSubstr("streamed")));

  // offload_param "nvme": the weights go to the worker's NVMe, through
  // buffer_size parameters.
  const nlohmann::json n = EstimateWithZero(
      R"({"offload_param": {"device": "nvme", "nvme_path": "/nvme", "buffer_size": 2e8},
          "stage3_max_live_parameters": 1e8})");
  EXPECT_EQ(n["param_nvme_buffer_elems"], 200000000);
  EXPECT_EQ(n["gpu_streamed"]["worker_nvme_bytes"], 2000000000);
}

TEST(ZoCtlEstimateTest, BadInputExitsTwoWithAReason) {
  Result r = RunZoCtl("estimate --params 13Q");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("'13Q' is not a count"));
  r = RunZoCtl("estimate --params 1B --servers 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("servers must be >= 1"));
  r = RunZoCtl("estimate --params 1B --config /nonexistent.json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("/nonexistent.json"));
  r = RunZoCtl("frobnicate");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("unknown command 'frobnicate'"));
}

}  // namespace
}  // namespace zo
