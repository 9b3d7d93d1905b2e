#include "common/memory_estimate.h"

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "common/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace zo {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::StatusIs;

// Figures below are computed by hand from docs/architecture.md's "Memory tiers":
// GPU 2+2 bytes/param; server RAM 4 (master) + 8 (m, v) + the gradient buffer
// (2 as received with one dp rank, a 4-byte fp32 sum with several) + 4 (two
// low-precision versions); with NVMe the 12 bytes of optimizer state move to
// disk and RAM gains buffer_count sub-group buffers of 12 bytes/element.

TEST(MemoryEstimateTest, OneBillionParamsInRam) {
  EstimateInput in;
  in.tensor_elems = {1000000000};
  ZO_ASSERT_OK_AND_ASSIGN(MemoryEstimate e, EstimateMemory(in));
  EXPECT_EQ(e.gpu.stage_params, 1000000000);
  // fp16 weights twice (the prefetch's idle copy) and fp32 gradients.
  EXPECT_EQ(e.gpu.total_bytes, 8000000000);
  EXPECT_EQ(e.gpu.host_staging_bytes, 4000000000);
  EXPECT_EQ(e.server.elems, 1000000000);
  EXPECT_EQ(e.server.master_bytes, 4000000000);
  EXPECT_EQ(e.server.moment_bytes, 8000000000);
  EXPECT_EQ(e.server.grad_accum_bytes, 2000000000);  // one dp rank: fp16 as received
  EXPECT_EQ(e.server.low_precision_bytes, 0);        // pulls round the master
  // The speculative update's second copy of the state.
  EXPECT_EQ(e.server.speculation_bytes, 12000000000);
  EXPECT_EQ(e.server.ram_bytes, 26000000000);
  EXPECT_EQ(e.server.nvme_bytes, 0);
  EXPECT_THAT(FormatEstimateTable(e), HasSubstr("fp16 gradients as received"));
  EXPECT_THAT(FormatEstimateTable(e), HasSubstr("speculative update (state's 2nd copy)"));
  EXPECT_THAT(FormatEstimateTable(e), Not(HasSubstr("copies for pulls")));
  in.speculative_update = false;
  ZO_ASSERT_OK_AND_ASSIGN(MemoryEstimate unspeculative, EstimateMemory(in));
  EXPECT_EQ(unspeculative.server.speculation_bytes, 0);
  EXPECT_EQ(unspeculative.server.ram_bytes, 14000000000);
  EXPECT_THAT(FormatEstimateTable(unspeculative), Not(HasSubstr("speculative update")));

  in.dp_ranks = 2;  // summed in fp32
  ZO_ASSERT_OK_AND_ASSIGN(MemoryEstimate two, EstimateMemory(in));
  EXPECT_EQ(two.server.grad_accum_bytes, 4000000000);
  EXPECT_EQ(two.server.ram_bytes, 16000000000);
  EXPECT_THAT(FormatEstimateTable(two), HasSubstr("fp32 gradient sum"));

  in.dpu = true;  // the version before the latest is recomputed, not kept
  ZO_ASSERT_OK_AND_ASSIGN(MemoryEstimate dpu, EstimateMemory(in));
  EXPECT_EQ(dpu.server.low_precision_bytes, 0);
  EXPECT_EQ(dpu.server.ram_bytes, 16000000000);
  EXPECT_THAT(FormatEstimateTable(dpu), HasSubstr("fp16 prior version (DPU): recomputed"));
  EXPECT_THAT(FormatEstimateTable(dpu), Not(HasSubstr("copies for pulls")));
  in.dp_ranks = 1;
  ZO_ASSERT_OK_AND_ASSIGN(MemoryEstimate dpu_one, EstimateMemory(in));
  EXPECT_EQ(dpu_one.server.ram_bytes, 14000000000);

  // Compensated: the GPU keeps the last two fp16 versions pulled, under
  // "device" only (it needs the step's gradients kept).
  in.dpu_compensation = true;
  ZO_ASSERT_OK_AND_ASSIGN(MemoryEstimate compensated, EstimateMemory(in));
  EXPECT_EQ(compensated.gpu.compensation_bytes, 4000000000);
  EXPECT_EQ(compensated.gpu.total_bytes, 12000000000);
  EXPECT_EQ(compensated.gpu_servers.compensation_bytes, 0);
  EXPECT_EQ(compensated.server.ram_bytes, 14000000000);
  EXPECT_THAT(FormatEstimateTable(compensated), HasSubstr("fp16 last two versions (compensation)"));
  EXPECT_THAT(FormatEstimateTable(dpu_one), Not(HasSubstr("(compensation)")));
}

// zo.gradient_accumulation "servers": the GPU keeps one layer's fp32
// gradients (bounded by the largest tensor), page-locks two gradient slots,
// pushes once per micro-batch, and the servers sum in fp32 even for one rank.
TEST(MemoryEstimateTest, GradientsSummedOnTheServersShowBesideTheDevicePolicy) {
  EstimateInput in;
  in.tensor_elems = {600000000, 300000000, 100000000};
  in.micro_batches = 4;
  in.speculative_update = false;
  ZO_ASSERT_OK_AND_ASSIGN(MemoryEstimate e, EstimateMemory(in));
  EXPECT_EQ(e.gpu.total_bytes, 8000000000);
  EXPECT_EQ(e.gpu.pushed_bytes_per_step, 2000000000);
  EXPECT_EQ(e.gpu_servers.grad_bytes, 2400000000);  // the 600 M tensor in fp32
  EXPECT_EQ(e.gpu_servers.total_bytes, 4000000000 + 2400000000);
  EXPECT_EQ(e.gpu_servers.host_staging_bytes, 3 * 2000000000LL);  // weights + 2 gradient slots
  EXPECT_EQ(e.gpu_servers.pushed_bytes_per_step, 4 * 2000000000LL);
  EXPECT_EQ(e.server.ram_bytes, 14000000000);
  EXPECT_EQ(e.server_ram_bytes_servers, 16000000000);  // fp32 sum instead of fp16 as received
  const std::string table = FormatEstimateTable(e);
  EXPECT_THAT(table, ::testing::ContainsRegex("device +servers"));
  EXPECT_THAT(table, ::testing::ContainsRegex("total, before activations +7.45 GiB +5.96 GiB"));
  EXPECT_THAT(table, HasSubstr("total, gradient_accumulation servers"));
  const nlohmann::json j = nlohmann::json::parse(FormatEstimateJson(e));
  EXPECT_EQ(j["gpu_gradient_accumulation_servers"]["total_bytes"], 6400000000);
  EXPECT_EQ(j["server"]["ram_bytes_gradient_accumulation_servers"], 16000000000);
  in.micro_batches = 0;
  EXPECT_THAT(EstimateMemory(in).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("micro-batches")));
}

// offload_param "cpu": the device keeps the window of weights and one
// layer's fp32 gradients; the host, the stage's weights and a gradient ring.
TEST(MemoryEstimateTest, StreamedWeightsShowAsAThirdPolicy) {
  EstimateInput in;
  in.tensor_elems = {600000000, 300000000, 100000000};
  in.micro_batches = 4;
  in.max_live_params = 250000000;
  ZO_ASSERT_OK_AND_ASSIGN(MemoryEstimate e, EstimateMemory(in));
  EXPECT_EQ(e.gpu_streamed.param_bytes, 500000000);
  EXPECT_EQ(e.gpu_streamed.next_param_bytes, 0);
  EXPECT_EQ(e.gpu_streamed.grad_bytes, 2400000000);
  EXPECT_EQ(e.gpu_streamed.total_bytes, 2900000000);
  // The weights' host copy, and a gradient ring of twice the largest tensor
  // (under the two micro-batch slots' 4 GB).
  EXPECT_EQ(e.gpu_streamed.host_staging_bytes, 2000000000 + 2400000000);
  const std::string table = FormatEstimateTable(e);
  EXPECT_THAT(table, HasSubstr("and streamed (250.0 M parameters live)"));
  EXPECT_THAT(table, ::testing::ContainsRegex("device +servers +streamed"));
  EXPECT_THAT(table,
              ::testing::ContainsRegex("total, before activations +7.45 GiB +5.96 GiB +2.70 GiB"));
  const nlohmann::json j = nlohmann::json::parse(FormatEstimateJson(e));
  EXPECT_EQ(j["gpu_streamed"]["total_bytes"], 2900000000);
  EXPECT_EQ(j["max_live_params"], 250000000);

  in.max_live_params = int64_t{1} << 40;  // more than the stage: all of it
  ZO_ASSERT_OK_AND_ASSIGN(e, EstimateMemory(in));
  EXPECT_EQ(e.gpu_streamed.param_bytes, 2000000000);
  in.max_live_params = -1;
  EXPECT_THAT(EstimateMemory(in).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_live_params")));
  in.max_live_params = 0;
  ZO_ASSERT_OK_AND_ASSIGN(e, EstimateMemory(in));
  EXPECT_THAT(FormatEstimateTable(e), ::testing::Not(HasSubstr("streamed")));
  EXPECT_FALSE(nlohmann::json::parse(FormatEstimateJson(e)).contains("gpu_streamed"));
}

// offload_param "nvme": the streamed weights move from the worker's host
// memory to its NVMe; the host keeps the pull's buffer and two read slots.
TEST(MemoryEstimateTest, StreamedWeightsOnNvmeLeaveTheHostTheBufferAndTwoSlots) {
  EstimateInput in;
  in.tensor_elems = {600000000, 300000000, 100000000};
  in.micro_batches = 4;
  in.max_live_params = 250000000;
  in.param_nvme_buffer_elems = 700000000;
  ZO_ASSERT_OK_AND_ASSIGN(MemoryEstimate e, EstimateMemory(in));
  EXPECT_EQ(e.gpu_streamed.worker_nvme_bytes, 2000000000);
  // The gradient ring (2.4 GB), the buffer (1.4 GB), two read slots of the
  // window, smaller than the largest tensor (1 GB); the device side is
  // unchanged.
  EXPECT_EQ(e.gpu_streamed.host_staging_bytes, 2400000000 + 1400000000 + 1000000000);
  EXPECT_EQ(e.gpu_streamed.total_bytes, 2900000000);
  EXPECT_EQ(e.gpu_servers.worker_nvme_bytes, 0);
  EXPECT_THAT(FormatEstimateTable(e),
              ::testing::ContainsRegex("worker NVMe \\(streamed weights\\) +0 B +0 B +1.86 GiB"));
  EXPECT_EQ(nlohmann::json::parse(FormatEstimateJson(e))["gpu_streamed"]["worker_nvme_bytes"],
            2000000000);

  in.param_nvme_buffer_elems = -1;
  EXPECT_THAT(EstimateMemory(in).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("param_nvme_buffer_elems")));
  in.param_nvme_buffer_elems = 700000000;
  in.max_live_params = 0;
  EXPECT_THAT(EstimateMemory(in).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs streaming")));
}

TEST(MemoryEstimateTest, ThirteenBillionOnNvmeOverTwoServers) {
  EstimateInput in;
  in.tensor_elems = {13000000000};
  in.pipeline_stages = 4;
  in.servers = 2;
  in.precision = DType::kBFloat16;
  in.nvme = true;
  in.sub_group_size = 100000000;
  // 13e9 / 4 Mi = 3099 full chunks and one of 1,851,904 elements. Server 0
  // holds the 1550 even chunks (all full), server 1 1549 full + the short one.
  ZO_ASSERT_OK_AND_ASSIGN(MemoryEstimate e, EstimateMemory(in));
  EXPECT_EQ(e.gpu.stage_params, 3250000000);
  EXPECT_EQ(e.gpu.param_bytes, 6500000000);
  EXPECT_EQ(e.server.elems, int64_t{1550} * 4194304);
  EXPECT_EQ(e.server.nvme_bytes, int64_t{12} * 6501171200);
  EXPECT_EQ(e.server.io_buffer_bytes, int64_t{4} * 100000000 * 12);
  // One dp rank: bf16 gradients 2 B + two bf16 versions 4 B per element,
  // plus the buffers.
  EXPECT_EQ(e.server.ram_bytes, int64_t{6} * 6501171200 + 4800000000);
}

// A small model's chunks are capped so every server holds a share; the
// estimate says the chunk size the servers will use, not the one asked.
TEST(MemoryEstimateTest, ChunkSizeIsTheCappedOne) {
  EstimateInput in;
  in.tensor_elems = {1000000};
  in.servers = 4;
  ZO_ASSERT_OK_AND_ASSIGN(MemoryEstimate e, EstimateMemory(in));
  EXPECT_LT(e.chunk_elems, in.chunk_elems);
  EXPECT_GE(e.chunk_elems * 4, 1000000);
  EXPECT_THAT(
      FormatEstimateTable(e),
      HasSubstr(absl::StrCat("chunks of ", FormatCount(static_cast<double>(e.chunk_elems)))));
  EXPECT_EQ(nlohmann::json::parse(FormatEstimateJson(e))["chunk_elems"], e.chunk_elems);
}

TEST(MemoryEstimateTest, SubGroupNeverExceedsTheServersShare) {
  EstimateInput in;
  in.tensor_elems = {1000};
  in.nvme = true;  // sub_group_size keeps DeepSpeed's 1e9 default
  ZO_ASSERT_OK_AND_ASSIGN(MemoryEstimate e, EstimateMemory(in));
  EXPECT_EQ(e.server.sub_group_elems, 1000);
  // One sub-group: the server allocates one buffer, whatever buffer_count.
  EXPECT_EQ(e.server.io_buffers, 1);
  EXPECT_EQ(e.server.io_buffer_bytes, 1000 * 12);
}

TEST(MemoryEstimateTest, SwapBuffersAreAtMostOnePerSubGroup) {
  EstimateInput in;
  in.tensor_elems = {2000};
  in.nvme = true;
  in.sub_group_size = 1000;
  in.buffer_count = 4;
  ZO_ASSERT_OK_AND_ASSIGN(MemoryEstimate e, EstimateMemory(in));
  EXPECT_EQ(e.server.io_buffers, 2);
  EXPECT_EQ(e.server.io_buffer_bytes, 2 * 1000 * 12);
  EXPECT_THAT(FormatEstimateTable(e), HasSubstr("swap buffers (2 x 1.00 k elements)"));
  in.tensor_elems = {10000};
  ZO_ASSERT_OK_AND_ASSIGN(e, EstimateMemory(in));
  EXPECT_EQ(e.server.io_buffers, 4);
}

TEST(MemoryEstimateTest, StagesBalanceWholeTensorsContiguously) {
  EstimateInput in;
  in.tensor_elems = {5, 1, 1, 1, 5, 1};
  in.pipeline_stages = 2;  // [5 1 1][1 5 1]
  ZO_ASSERT_OK_AND_ASSIGN(MemoryEstimate two, EstimateMemory(in));
  EXPECT_EQ(two.gpu.stage_params, 7);
  in.pipeline_stages = 3;  // [5][1 1 1][5 1] or [5 1][1 1][5 1]
  ZO_ASSERT_OK_AND_ASSIGN(MemoryEstimate three, EstimateMemory(in));
  EXPECT_EQ(three.gpu.stage_params, 6);
  in.pipeline_stages = 10;  // more stages than tensors: the largest tensor
  ZO_ASSERT_OK_AND_ASSIGN(MemoryEstimate ten, EstimateMemory(in));
  EXPECT_EQ(ten.gpu.stage_params, 5);
}

TEST(MemoryEstimateTest, RejectsImpossibleInput) {
  EstimateInput in;
  in.tensor_elems = {100};
  in.servers = 0;
  EXPECT_THAT(EstimateMemory(in), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("servers must be >= 1, got 0")));
  in.servers = 1;
  in.nvme = true;
  in.buffer_count = 2;
  EXPECT_THAT(EstimateMemory(in),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("buffer_count must be >= 3")));
  in.nvme = false;
  in.precision = DType::kFloat32;
  EXPECT_THAT(EstimateMemory(in),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fp16 or bf16")));
  in.precision = DType::kFloat16;
  in.tensor_elems = {0};
  EXPECT_THAT(EstimateMemory(in),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no parameters")));
}

// Found by fuzz/manifest_file_fuzzer.cc: a 2^62-element manifest overflowed
// the byte counts (elements x 4).
TEST(MemoryEstimateTest, RejectsSizesWhoseBytesOverflow) {
  EstimateInput in;
  in.tensor_elems = {int64_t{1} << 62};
  EXPECT_THAT(EstimateMemory(in), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("more than the 2^48 an estimate covers")));
  in.tensor_elems = {int64_t{1} << 48};
  in.nvme = true;
  in.buffer_count = 1 << 30;
  EXPECT_THAT(EstimateMemory(in), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("buffer_count must be <= 1024")));
  in.buffer_count = 1024;
  in.sub_group_size = int64_t{1} << 48;
  ZO_ASSERT_OK_AND_ASSIGN(MemoryEstimate e, EstimateMemory(in));
  EXPECT_EQ(e.server.io_buffer_bytes, (int64_t{1} << 48) * 12);  // one sub-group, one buffer
  in.sub_group_size = int64_t{1} << 38;                          // 1024 sub-groups
  ZO_ASSERT_OK_AND_ASSIGN(e, EstimateMemory(in));
  EXPECT_EQ(e.server.io_buffer_bytes, int64_t{1024} * (int64_t{1} << 38) * 12);
}

TEST(MemoryEstimateTest, TableAndJsonCarryTheFigures) {
  EstimateInput in;
  in.tensor_elems = {1000000000};
  in.nvme = true;
  in.sub_group_size = 1000000;
  ZO_ASSERT_OK_AND_ASSIGN(MemoryEstimate e, EstimateMemory(in));
  const std::string table = FormatEstimateTable(e);
  EXPECT_THAT(table, HasSubstr("1.00 B parameters"));
  EXPECT_THAT(table, HasSubstr("optimizer state in NVMe"));
  EXPECT_THAT(table, HasSubstr("swap buffers (4 x 1.00 M elements)"));
  // 6e9 + 48e6 bytes = 5.63 GiB of RAM; 12e9 bytes = 11.18 GiB of NVMe.
  EXPECT_THAT(table, ::testing::ContainsRegex("total +5.63 GiB +11.18 GiB"));

  const nlohmann::json j = nlohmann::json::parse(FormatEstimateJson(e));
  EXPECT_EQ(j["parameters"], 1000000000);
  EXPECT_EQ(j["optimizer_device"], "nvme");
  EXPECT_EQ(j["server"]["ram_bytes"], int64_t{6000000000} + 48000000);
  EXPECT_EQ(j["server"]["nvme_bytes"], 12000000000);
  EXPECT_EQ(j["gpu"]["total_bytes"], 8000000000);
}

}  // namespace
}  // namespace zo
