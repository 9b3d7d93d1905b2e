// The gpu_dpu and gpu_largest harnesses end to end at a toy size on the CPU
// backend (no GPU here): the embedded server, the server-alone loop, the DPU
// run, zo-train's loop and the rows they report (no assertion on speed).
#include "bench/internal/gpu_offload_rows.h"

#include <cmath>
#include <cstdint>
#include <filesystem>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/select_backend.h"
#include "worker/model/model.h"

namespace zo::bench_internal {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::StatusIs;

bench::GpuBenchOptions Toy() {
  bench::GpuBenchOptions o;
  o.n_layer = 1;
  o.n_embd = 32;
  o.n_head = 2;
  o.block_size = 16;
  o.vocab = 64;
  o.batch = 2;
  o.warmup_steps = 0;
  o.steps = 3;
  o.largest_layers = 2;
  o.largest_width = 32;
  o.largest_heads = 2;
  o.largest_block = 32;
  o.largest_batch = 2;
  o.largest_steps = 6;
  o.largest_device = "cpu";
  return o;
}

class GpuOffloadedRowTest : public ::testing::TestWithParam<bool> {};

TEST_P(GpuOffloadedRowTest, ReportsTheStepAgainstComputeAloneAndTheSlowerOfComputeAndServer) {
  const bench::GpuBenchOptions o = Toy();
  auto be = backend::SelectBackend({.device = "cpu"});
  ASSERT_TRUE(be.ok()) << be.status();
  const double compute_alone_s = 1e-4;
  const bool dpu = GetParam();
  absl::StatusOr<nlohmann::json> row = MeasureGpuOffloaded(o, **be, compute_alone_s, dpu);
  ASSERT_TRUE(row.ok()) << row.status();
  const nlohmann::json& r = *row;
  EXPECT_EQ(r["workload"], dpu ? "gpu_dpu" : "gpu_sync");
  EXPECT_EQ(r["params"].get<int64_t>(),
            model::MakeGpt({.n_layer = 1, .n_embd = 32, .n_head = 2, .block_size = 16, .vocab = 64})
                ->param_count());
  EXPECT_GT(r["server_alone_s"].get<double>(), 0);
  EXPECT_GT(r["step_s"].get<double>(), 0);
  EXPECT_LE(r["step_s_min"].get<double>(), r["step_s"].get<double>());
  EXPECT_DOUBLE_EQ(r["ratio"].get<double>(), r["step_s"].get<double>() / compute_alone_s);
  EXPECT_DOUBLE_EQ(
      r["ratio_to_slower"].get<double>(),
      r["step_s"].get<double>() / std::max(compute_alone_s, r["server_alone_s"].get<double>()));
}

INSTANTIATE_TEST_SUITE_P(DpuAndSync, GpuOffloadedRowTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "dpu" : "sync");
                         });

TEST(GpuLargestRowTest, TrainsZoTrainsModelAndReportsItsLosses) {
  const bench::GpuBenchOptions o = Toy();
  absl::StatusOr<nlohmann::json> row = MeasureGpuLargest(o);
  ASSERT_TRUE(row.ok()) << row.status();
  const nlohmann::json& r = *row;
  EXPECT_EQ(r["workload"], "gpu_largest");
  EXPECT_EQ(r["steps"].get<int>(), 6);
  ASSERT_EQ(r["losses"].size(), 6u);
  for (const auto& loss : r["losses"]) EXPECT_TRUE(std::isfinite(loss.get<double>()));
  EXPECT_GT(r["params"].get<int64_t>(), 2 * 12 * 32 * 32);
  EXPECT_GT(r["peak_host_rss_bytes"].get<int64_t>(), 0);
  // 12 bytes of optimizer state and 2 of gradients per parameter, at least.
  EXPECT_GE(r["server_ram_bytes_estimate"].get<int64_t>(), 14 * r["params"].get<int64_t>());
  EXPECT_GT(r["step_s"].get<double>(), 0);
}

// ZeRO-Infinity's shape at toy size: weights streamed within a budget from
// a file, the optimizer state on NVMe (a directory here); the same losses
// as resident, in RAM.
TEST(GpuLargestRowTest, StreamsAndSpillsAsAsked) {
  bench::GpuBenchOptions o = Toy();
  o.largest_gradient_accumulation = "servers";
  absl::StatusOr<nlohmann::json> resident = MeasureGpuLargest(o);
  ASSERT_TRUE(resident.ok()) << resident.status();
  o.largest_device_memory_budget = int64_t{290} << 10;  // a 37 KiB window of 56 KiB
  o.largest_nvme_dir = ::testing::TempDir() + "/largest_nvme";
  std::filesystem::create_directories(o.largest_nvme_dir);
  absl::StatusOr<nlohmann::json> row = MeasureGpuLargest(o);
  ASSERT_TRUE(row.ok()) << row.status();
  EXPECT_EQ((*row)["streamed"], true);
  EXPECT_EQ((*row)["optimizer_device"], "nvme");
  EXPECT_EQ((*row)["param_device"], "nvme");  // the streamed weights in a file there too
  EXPECT_EQ((*row)["device_memory_budget"], int64_t{290} << 10);
  EXPECT_GE((*row)["server_nvme_bytes_estimate"].get<int64_t>(),
            12 * (*row)["params"].get<int64_t>());
  EXPECT_EQ((*row)["losses"], (*resident)["losses"]);
}

TEST(GpuBenchOptionsTest, NamesWhatTheRowsNeed) {
  bench::GpuBenchOptions o = Toy();
  o.step_rows = false;
  EXPECT_THAT(bench::ValidateGpuBenchOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("gpu_step")));
  o.dpu = false;
  EXPECT_THAT(bench::ValidateGpuBenchOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("gpu_step")));
  o.sync = false;
  EXPECT_THAT(bench::ValidateGpuBenchOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no rows")));
  o.largest = true;
  EXPECT_TRUE(bench::ValidateGpuBenchOptions(o).ok());
  o.largest_heads = 5;
  EXPECT_THAT(bench::ValidateGpuBenchOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("gpu_largest")));
}

}  // namespace
}  // namespace zo::bench_internal
