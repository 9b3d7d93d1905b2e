// The shipped examples (examples/configs/*.json): each loads cleanly, has the
// values its name promises, and survives Config -> JSON -> Config.
#include <filesystem>
#include <string>

#include "common/config.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

const std::string kExamples = std::string(ZO_SOURCE_DIR) + "/examples/configs/";

TEST(ConfigTest, ExampleCpuOffloadFp16) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, LoadConfigFile(kExamples + "cpu_offload_fp16.json",
                                                              {.dp_world_size = 2}));
  const Config& c = loaded.config;
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdamW);
  EXPECT_EQ(c.optimizer.params.betas[1], 0.95);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 0.0);
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_TRUE(c.zero_optimization.offload_optimizer.pin_memory);
}

TEST(ConfigTest, ExampleNvmeOffloadFp16) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, LoadConfigFile(kExamples + "nvme_offload_fp16.json",
                                                              {.dp_world_size = 4}));
  const Config& c = loaded.config;
  EXPECT_EQ(c.train_batch_size, 2 * 8 * 4);
  EXPECT_EQ(c.fp16.initial_scale_power, 12);
  EXPECT_EQ(c.zero_optimization.stage, 3);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 1'000'000'000);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, OffloadDevice::kNvme);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.nvme_path, "/local_nvme");
  EXPECT_EQ(c.zero_optimization.offload_param.device, OffloadDevice::kNvme);
  EXPECT_EQ(c.zero_optimization.offload_param.buffer_size, 100'000'000);
  EXPECT_EQ(c.aio.queue_depth, 16);
  EXPECT_EQ(c.aio.intra_op_parallelism, 2);
}

TEST(ConfigTest, ExampleBf16CpuOffloadWithCosineSchedule) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, LoadConfigFile(kExamples + "bf16_cpu_offload.json",
                                                              {.dp_world_size = 8}));
  const Config& c = loaded.config;
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.gradient_clipping, 0.5);
  ASSERT_TRUE(c.scheduler.has_value());
  EXPECT_EQ(c.scheduler->type, SchedulerType::kWarmupCosineLR);
  EXPECT_EQ(c.scheduler->params.total_num_steps, 10000);
  EXPECT_EQ(c.scheduler->params.cos_min_ratio, 0.1);
  EXPECT_EQ(c.scheduler->params.warmup_type, WarmupType::kLinear);
}

TEST(ConfigTest, ExampleFp16StaticScaleWithServersAndDpu) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded,
                          LoadConfigFile(kExamples + "fp16_static_scale_servers.json"));
  const Config& c = loaded.config;
  EXPECT_EQ(c.fp16.loss_scale, 1024.0);
  EXPECT_FALSE(c.optimizer.params.adam_w_mode);
  EXPECT_EQ(c.gradient_clipping, 0.0);
  EXPECT_EQ(c.scheduler->type, SchedulerType::kWarmupDecayLR);
  EXPECT_EQ(c.scheduler->params.total_num_steps, 2000);
  EXPECT_THAT(c.zo.servers,
              ElementsAre("offload-0.example:50051", "offload-1.example:50051", "[fd00::2]:50051"));
  EXPECT_EQ(c.zo.chunk_elems, 8 << 20);
  EXPECT_TRUE(c.zo.dpu.enabled);
  EXPECT_EQ(c.zo.dpu.warmup_steps, 20);
  EXPECT_EQ(c.zo.auth.token_file, "/etc/zo/token");
}

// Every shipped example loads cleanly and survives Config -> JSON -> Config.
TEST(ConfigTest, EveryExampleLoadsWithoutWarningsAndRoundTrips) {
  int examples = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kExamples)) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().string());
    ++examples;
    ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded,
                            LoadConfigFile(entry.path().string(), {.dp_world_size = 2}));
    EXPECT_THAT(loaded.warnings, IsEmpty());
    ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig again,
                            ParseConfig(ConfigToJson(loaded.config), {.dp_world_size = 2}));
    EXPECT_TRUE(again.config == loaded.config) << ConfigToJson(loaded.config, 2);
    EXPECT_THAT(again.warnings, IsEmpty());
  }
  EXPECT_GE(examples, 4);
}

TEST(ConfigTest, ExampleGpuGpt2Bf16WithDpu) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded,
                          LoadConfigFile(kExamples + "gpu_gpt2_bf16_dpu.json"));
  const Config& c = loaded.config;
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_TRUE(c.zo.dpu.enabled);
  EXPECT_EQ(c.zo.dpu.warmup_steps, 3);
  ASSERT_TRUE(c.scheduler.has_value());
  EXPECT_EQ(c.scheduler->type, SchedulerType::kWarmupLR);
  EXPECT_EQ(c.scheduler->params.warmup_num_steps, 50);
}

}  // namespace
}  // namespace zo
