#include "common/config.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/log_capture.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::IsOk;
using ::testing::Not;
using testing::StatusIs;
using ::testing::UnorderedElementsAre;

// A config with a valid batch size plus `body` (comma-separated keys).
std::string WithBatch(const std::string& body) {
  return body.empty() ? R"({"train_batch_size": 8})" : R"({"train_batch_size": 8, )" + body + "}";
}

absl::StatusOr<LoadedConfig> Parse(const std::string& body) { return ParseConfig(WithBatch(body)); }

TEST(ConfigTest, EmptyConfigHasDeepSpeedDefaults) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, Parse(""));
  const Config& c = loaded.config;
  EXPECT_THAT(loaded.warnings, IsEmpty());
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);

  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdam);
  EXPECT_EQ(c.optimizer.params.lr, 1e-3);
  EXPECT_EQ(c.optimizer.params.betas[0], 0.9);
  EXPECT_EQ(c.optimizer.params.betas[1], 0.999);
  EXPECT_EQ(c.optimizer.params.eps, 1e-8);
  EXPECT_EQ(c.optimizer.params.weight_decay, 0.0);
  EXPECT_TRUE(c.optimizer.params.bias_correction);
  EXPECT_TRUE(c.optimizer.params.adam_w_mode);
  EXPECT_FALSE(c.scheduler.has_value());

  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 0.0);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_FALSE(c.fp16.consecutive_hysteresis);
  EXPECT_EQ(c.fp16.min_loss_scale, 1.0);
  EXPECT_FALSE(c.fp16.auto_cast);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_EQ(c.gradient_clipping, 0.0);

  const ZeroConfig& z = c.zero_optimization;
  EXPECT_EQ(z.stage, 0);
  EXPECT_EQ(z.sub_group_size, 1'000'000'000);
  EXPECT_EQ(z.offload_optimizer.device, OffloadDevice::kNone);
  EXPECT_EQ(z.offload_optimizer.nvme_path, "");
  EXPECT_FALSE(z.offload_optimizer.pin_memory);
  EXPECT_EQ(z.offload_optimizer.buffer_count, 4);
  EXPECT_FALSE(z.offload_optimizer.fast_init);
  EXPECT_EQ(z.offload_param.device, OffloadDevice::kNone);
  EXPECT_EQ(z.offload_param.buffer_count, 5);
  EXPECT_EQ(z.offload_param.buffer_size, 100'000'000);
  EXPECT_EQ(z.offload_param.max_in_cpu, 1'000'000'000);

  EXPECT_EQ(c.aio.block_size, 1048576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);
  EXPECT_FALSE(c.aio.single_submit);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_FALSE(c.aio.use_gds);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_FALSE(c.wall_clock_breakdown);

  EXPECT_THAT(c.zo.servers, IsEmpty());
  EXPECT_EQ(c.zo.chunk_elems, 4194304);
  EXPECT_TRUE(c.zo.nvme_checksums);
  EXPECT_FALSE(c.zo.dpu.enabled);
  EXPECT_EQ(c.zo.dpu.warmup_steps, 40);
  EXPECT_EQ(c.zo.auth, AuthConfig{});

  // The same thing, said as a whole struct.
  Config expected;
  expected.train_batch_size = expected.train_micro_batch_size_per_gpu = 8;
  expected.gradient_accumulation_steps = 1;
  EXPECT_TRUE(c == expected);
}

TEST(ConfigTest, TypeAdamRunsAdamWByDefault) {
  ZO_ASSERT_OK_AND_ASSIGN(
      LoadedConfig loaded,
      Parse(R"("optimizer": {"type": "Adam", "params": {"weight_decay": 0.1}})"));
  EXPECT_EQ(loaded.config.optimizer.type, OptimizerType::kAdam);
  EXPECT_TRUE(loaded.config.optimizer.params.adam_w_mode);
  EXPECT_THAT(loaded.notes, Contains(HasSubstr("type Adam runs as AdamW")));

  ZO_ASSERT_OK_AND_ASSIGN(
      LoadedConfig l2, Parse(R"("optimizer": {"type": "Adam", "params": {"adam_w_mode": false}})"));
  EXPECT_FALSE(l2.config.optimizer.params.adam_w_mode);
}

TEST(ConfigTest, TypeAdamWForcesAdamWMode) {
  ZO_ASSERT_OK_AND_ASSIGN(
      LoadedConfig loaded,
      Parse(R"("optimizer": {"type": "adamw", "params": {"adam_w_mode": false}})"));
  EXPECT_EQ(loaded.config.optimizer.type, OptimizerType::kAdamW);
  EXPECT_TRUE(loaded.config.optimizer.params.adam_w_mode);
  EXPECT_THAT(loaded.warnings, ElementsAre(HasSubstr("adam_w_mode = false ignored")));
}

TEST(ConfigTest, OptimizerTypeIsCaseInsensitive) {
  for (const auto& [spelling, type] :
       std::vector<std::pair<std::string, OptimizerType>>{{"ADAM", OptimizerType::kAdam},
                                                          {"adagrad", OptimizerType::kAdagrad},
                                                          {"lion", OptimizerType::kLion}}) {
    ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded,
                            Parse(R"("optimizer": {"type": ")" + spelling + R"("})"));
    EXPECT_EQ(loaded.config.optimizer.type, type) << spelling;
  }
  EXPECT_EQ(EnumName(OptimizerType::kAdamW), "AdamW");
}

// DeepSpeed's code does not clip when the key is absent
// (GRADIENT_CLIPPING_DEFAULT = 0.0), whatever its documentation says.
TEST(ConfigTest, GradientClippingAbsentMeansNoClippingWithANote) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, Parse(""));
  EXPECT_EQ(loaded.config.gradient_clipping, 0.0);
  EXPECT_THAT(loaded.notes, Contains(HasSubstr("no gradient_clipping: gradients are not clipped")));
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig on, Parse(R"("gradient_clipping": 1.0)"));
  EXPECT_EQ(on.config.gradient_clipping, 1.0);
  EXPECT_THAT(on.notes, Not(Contains(HasSubstr("gradient_clipping"))));
}

TEST(ConfigTest, WarmupLRDefaultsToLogWarmup) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, Parse(R"("scheduler": {"type": "WarmupLR"})"));
  ASSERT_TRUE(loaded.config.scheduler.has_value());
  const SchedulerParams& p = loaded.config.scheduler->params;
  EXPECT_EQ(loaded.config.scheduler->type, SchedulerType::kWarmupLR);
  EXPECT_EQ(p.warmup_type, WarmupType::kLog);
  EXPECT_EQ(p.warmup_min_lr, 0.0);
  EXPECT_EQ(p.warmup_max_lr, 0.001);
  EXPECT_EQ(p.warmup_num_steps, 1000);
  EXPECT_THAT(loaded.notes, Contains(HasSubstr("warmup_type defaults to \"log\"")));
}

TEST(ConfigTest, WarmupCosineLRDefaults) {
  ZO_ASSERT_OK_AND_ASSIGN(
      LoadedConfig loaded,
      Parse(R"("scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 5000}})"));
  const SchedulerParams& p = loaded.config.scheduler->params;
  EXPECT_EQ(p.total_num_steps, 5000);
  EXPECT_EQ(p.warmup_min_ratio, 0.0);
  EXPECT_EQ(p.warmup_num_steps, 1000);
  EXPECT_EQ(p.cos_min_ratio, 0.0001);
  EXPECT_EQ(p.warmup_type, WarmupType::kLog);
}

TEST(ConfigTest, AioThreadCountIsReadAsIntraOpParallelismWithAWarning) {
  testing::ScopedLogCapture log;
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, Parse(R"("aio": {"thread_count": 4})"));
  EXPECT_EQ(loaded.config.aio.intra_op_parallelism, 4);
  const auto renamed =
      AllOf(HasSubstr("'aio.thread_count' was renamed"), HasSubstr("'aio.intra_op_parallelism'"));
  EXPECT_THAT(loaded.warnings, ElementsAre(renamed));
  EXPECT_THAT(log.lines(), Contains(AllOf(HasSubstr("WARNING"), renamed)));

  EXPECT_THAT(Parse(R"("aio": {"thread_count": 0})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("aio.thread_count = 0")));
  EXPECT_THAT(Parse(R"("aio": {"thread_count": 2, "intra_op_parallelism": 2})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("give only one")));
}

TEST(ConfigTest, Bfloat16IsAnotherSpellingOfBf16) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded,
                          Parse(R"("bf16": null, "bfloat16": {"enabled": true})"));
  EXPECT_TRUE(loaded.config.bf16.enabled);
  EXPECT_THAT(loaded.warnings, IsEmpty());
}

TEST(ConfigTest, IntegersMayBeWrittenAsIntegralFloats) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded,
                          Parse(R"("zero_optimization": {"sub_group_size": 1e9, "stage": 3.0},
               "zo": {"chunk_elems": 1.6e7})"));
  EXPECT_EQ(loaded.config.zero_optimization.sub_group_size, 1'000'000'000);
  EXPECT_EQ(loaded.config.zero_optimization.stage, 3);
  EXPECT_EQ(loaded.config.zo.chunk_elems, 16'000'000);
}

TEST(ConfigTest, NvmeChecksumsCanBeTurnedOffWithANote) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, Parse(R"("zo": {"nvme_checksums": false})"));
  EXPECT_FALSE(loaded.config.zo.nvme_checksums);
  EXPECT_THAT(loaded.notes, Contains(HasSubstr("zo.nvme_checksums is false")));
  EXPECT_THAT(Parse(R"("zo": {"nvme_checksums": "no"})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("zo.nvme_checksums")));
}

TEST(ConfigTest, NullMeansAbsent) {
  ZO_ASSERT_OK_AND_ASSIGN(
      LoadedConfig loaded,
      Parse(R"("scheduler": null, "optimizer": null, "fp16": {"loss_scale": null})"));
  EXPECT_FALSE(loaded.config.scheduler.has_value());
  EXPECT_EQ(loaded.config.fp16.loss_scale, 0.0);
  EXPECT_THAT(loaded.warnings, IsEmpty());
}

struct BatchCase {
  const char* json;
  int dp;
  int64_t train_batch, micro, gas;
};

TEST(ConfigTest, BatchSizesAreInferredLikeDeepSpeed) {
  const BatchCase cases[] = {
      {R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
           "gradient_accumulation_steps": 2})",
       4, 32, 4, 2},
      {R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})", 1, 32, 4, 8},
      {R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})", 2, 32, 4, 4},
      {R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})", 1, 32, 16, 2},
      {R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})", 4, 32, 4, 2},
      {R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5})", 2, 30, 3, 5},
      {R"({"train_batch_size": 32})", 1, 32, 32, 1},
      {R"({"train_batch_size": 32})", 8, 32, 4, 1},
      {R"({"train_micro_batch_size_per_gpu": 6})", 1, 6, 6, 1},
      {R"({"train_micro_batch_size_per_gpu": 6})", 3, 18, 6, 1},
      // Hugging Face writes "auto" for what it fills in: counts as absent.
      {R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4,
           "gradient_accumulation_steps": "auto"})",
       2, 8, 4, 1},
  };
  for (const BatchCase& bc : cases) {
    SCOPED_TRACE(absl::StrCat(bc.json, " dp=", bc.dp));
    ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, ParseConfig(bc.json, {.dp_world_size = bc.dp}));
    EXPECT_EQ(loaded.config.train_batch_size, bc.train_batch);
    EXPECT_EQ(loaded.config.train_micro_batch_size_per_gpu, bc.micro);
    EXPECT_EQ(loaded.config.gradient_accumulation_steps, bc.gas);
    EXPECT_THAT(loaded.warnings, IsEmpty());
  }
}

struct ErrorCase {
  std::string json;  // a whole config
  int dp;
  std::string message;
};

void ExpectInvalid(const std::vector<ErrorCase>& cases) {
  for (const ErrorCase& ec : cases) {
    SCOPED_TRACE(ec.json);
    EXPECT_THAT(ParseConfig(ec.json, {.dp_world_size = ec.dp}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(ec.message)));
  }
}

TEST(ConfigTest, BatchSizesThatDoNotMultiplyOutAreErrors) {
  ExpectInvalid({
      {R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 3,
           "gradient_accumulation_steps": 2})",
       4,
       "train_batch_size 32 != train_micro_batch_size_per_gpu 3 * gradient_accumulation_steps 2 "
       "* dp_world_size 4"},
      {R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4})", 2,
       "train_batch_size 30 is not divisible by train_micro_batch_size_per_gpu 4 * "
       "dp_world_size 2"},
      {R"({"train_batch_size": 30, "gradient_accumulation_steps": 4})", 1,
       "train_batch_size 30 is not divisible by gradient_accumulation_steps 4 * dp_world_size 1"},
      {R"({"train_batch_size": 30})", 4,
       "train_batch_size 30 is not divisible by gradient_accumulation_steps 1 * dp_world_size 4"},
      {R"({})", 1, "train_batch_size or train_micro_batch_size_per_gpu must be given"},
      {R"({"gradient_accumulation_steps": 4})", 1, "must be given"},
      {R"({"train_batch_size": "auto"})", 1, "must be given"},
      {R"({"train_batch_size": 0})", 1, "train_batch_size = 0: must be >= 1"},
      {R"({"train_micro_batch_size_per_gpu": "big"})", 1,
       "train_micro_batch_size_per_gpu = \"big\": expected an integer"},
      {R"({"train_micro_batch_size_per_gpu": 4611686018427387904,
           "gradient_accumulation_steps": 4})",
       1, "overflows"},
      {R"({"train_batch_size": 8})", 0, "dp_world_size = 0: must be >= 1"},
  });
}

TEST(ConfigTest, BadValuesAreErrorsNamingKeyAndValue) {
  std::vector<ErrorCase> cases;
  for (const auto& [body, message] : std::vector<std::pair<std::string, std::string>>{
           {R"("optimizer": {"type": "Adam", "params": {"betas": [0.9, 1.5]}})",
            "optimizer.params.betas[1] = 1.5: must be in [0, 1)"},
           {R"("optimizer": {"type": "Adam", "params": {"betas": [0.9]}})",
            "optimizer.params.betas = [0.9]: expected an array of 2 values"},
           {R"("optimizer": {"type": "Adam", "params": {"eps": 0}})",
            "optimizer.params.eps = 0: must be > 0"},
           {R"("optimizer": {"type": "Adam", "params": {"weight_decay": -0.1}})",
            "optimizer.params.weight_decay = -0.1: must be >= 0"},
           {R"("optimizer": {"type": "Adam", "params": {"lr": "fast"}})",
            "optimizer.params.lr = \"fast\": expected a number"},
           {R"("optimizer": {"type": "Adam", "params": {"lr": "auto"}})",
            "only understood for the batch-size keys"},
           {R"("optimizer": {"type": "Adam", "params": {"amsgrad": true}})",
            "optimizer.params.amsgrad = true: not supported"},
           {R"("optimizer": {"type": "SGD"})",
            "optimizer.type = \"SGD\": must be one of Adam, AdamW, Adagrad, Lion"},
           {R"("optimizer": {"params": {}})", "optimizer.type: required"},
           {R"("optimizer": [])", "optimizer = []: expected an object"},
           {R"("scheduler": {"type": "OneCycle"})",
            "scheduler.type = \"OneCycle\": must be one of WarmupLR, WarmupDecayLR, "
            "WarmupCosineLR"},
           {R"("scheduler": {"params": {}})", "scheduler.type: required"},
           {R"("scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}})",
            "scheduler.params.total_num_steps: required for WarmupDecayLR"},
           {R"("scheduler": {"type": "WarmupCosineLR"})",
            "scheduler.params.total_num_steps: required for WarmupCosineLR"},
           {R"("scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100}})",
            "scheduler.params.total_num_steps = 100: must be > warmup_num_steps 1000"},
           {R"("scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}})",
            "scheduler.params.warmup_type = \"cosine\": must be one of log, linear"},
           {R"("scheduler": {"type": "WarmupCosineLR",
                             "params": {"total_num_steps": 9999, "cos_min_ratio": 2}})",
            "scheduler.params.cos_min_ratio = 2: must be in [0, 1]"},
           {R"("fp16": {"enabled": true}, "bf16": {"enabled": true})",
            "fp16.enabled and bf16.enabled are both true"},
           {R"("fp16": {"enabled": "yes"})", "fp16.enabled = \"yes\": expected true or false"},
           {R"("fp16": {"loss_scale": -1})", "fp16.loss_scale = -1: must be >= 0"},
           {R"("fp16": {"hysteresis": 0})", "fp16.hysteresis = 0: must be >= 1"},
           {R"("fp16": {"min_loss_scale": 0})", "fp16.min_loss_scale = 0: must be > 0"},
           {R"("gradient_clipping": -0.5)", "gradient_clipping = -0.5: must be >= 0"},
           {R"("steps_per_print": 0)", "steps_per_print = 0: must be >= 1"},
           {R"("zero_optimization": 3)", "zero_optimization = 3: expected an object"},
           {R"("zero_optimization": {"stage": 4})",
            "zero_optimization.stage = 4: must be in [0, 3]"},
           {R"("zero_optimization": {"stage": 2.5})",
            "zero_optimization.stage = 2.5: expected an integer"},
           {R"("zero_optimization": {"stage": 1e30})",
            "zero_optimization.stage = 1e+30: out of range"},
           {R"("zero_optimization": {"sub_group_size": 0})",
            "zero_optimization.sub_group_size = 0: must be > 0"},
           {R"("zero_optimization": {"offload_optimizer": {"device": "disk"}})",
            "zero_optimization.offload_optimizer.device = \"disk\": must be one of none, cpu, "
            "nvme"},
           {R"("zero_optimization": {"offload_optimizer": {"device": "nvme"}})",
            "zero_optimization.offload_optimizer.nvme_path: required when device is nvme"},
           {R"("zero_optimization": {"offload_param": {"device": "nvme", "nvme_path": ""}})",
            "zero_optimization.offload_param.nvme_path: required when device is nvme"},
           {R"("zero_optimization": {"offload_optimizer":
                 {"device": "nvme", "nvme_path": "/nvme", "buffer_count": 2}})",
            "zero_optimization.offload_optimizer.buffer_count = 2: must be >= 3 with device nvme"},
           {R"("zero_optimization": {"offload_param": {"buffer_size": 0}})",
            "zero_optimization.offload_param.buffer_size = 0: must be > 0"},
           {R"("zero_optimization": {"stage3_max_live_parameters": 0})",
            "zero_optimization.stage3_max_live_parameters = 0: must be > 0"},
           {R"("aio": {"block_size": 3000})", "aio.block_size = 3000: must be a power of two"},
           {R"("aio": {"block_size": 2048})",
            "aio.block_size = 2048: must be a power of two >= 4096"},
           {R"("aio": {"queue_depth": 0})", "aio.queue_depth = 0: must be >= 1"},
           {R"("aio": {"use_gds": 1})", "aio.use_gds = 1: expected true or false"},
           {R"("zo": {"servers": "a:1"})", "zo.servers = \"a:1\": expected an array"},
           {R"("zo": {"servers": ["a:1", "b"]})", "zo.servers[1] = \"b\": must be host:port"},
           {R"("zo": {"servers": ["a:70000"]})", "zo.servers[0] = \"a:70000\""},
           {R"("zo": {"servers": ["a:0"]})", "zo.servers[0] = \"a:0\""},
           {R"("zo": {"servers": [":80"]})", "zo.servers[0] = \":80\""},
           {R"("zo": {"servers": ["::1:80"]})", "zo.servers[0] = \"::1:80\""},
           {R"("zo": {"servers": ["a:1x"]})", "zo.servers[0] = \"a:1x\""},
           {R"("zo": {"servers": [7]})", "zo.servers[0] = 7: expected a string"},
           {R"("zo": {"servers": ["a:1", "b:2", "a:1"]})",
            "zo.servers[2] = \"a:1\": duplicate server"},
           {R"("zo": {"chunk_elems": 0})", "zo.chunk_elems = 0: must be > 0"},
           {R"("zo": {"max_consecutive_skips": -1})",
            "zo.max_consecutive_skips = -1: must be >= 0"},
           {R"("zo": {"dpu": {"warmup_steps": -1}})", "zo.dpu.warmup_steps = -1: must be >= 0"},
           {R"("zo": {"auth": {"tls_cert": "c.pem"}})",
            "zo.auth.tls_key: required when zo.auth.tls_cert is given"},
           {R"("zo": {"auth": {"tls_key": "k.pem"}})",
            "zo.auth.tls_cert: required when zo.auth.tls_key is given"},
           {R"("zo": {"param_groups": {}})", "zo.param_groups = {}: expected an array of objects"},
           {R"("zo": {"param_groups": [{}, 3]})", "zo.param_groups[1] = 3: expected an object"},
           {R"("zo": {"param_groups": [{"betas": [0.9, 1]}]})",
            "zo.param_groups[0].betas[1] = 1: must be in [0, 1)"},
           {R"("zo": {"param_groups": [{"lr": 0.1}]})",
            "zo.param_groups[0].lr = 0.1: a group's learning rate is not part of the config"},
           {R"("zo": {"client_lr": true}, "scheduler": {"type": "WarmupLR"})",
            "zo.client_lr is true and a scheduler section is given"},
           {R"("zo": {"connections_per_server": 0})",
            "zo.connections_per_server = 0: must be in [1, 16]"},
           {R"("zo": {"connections_per_server": 17})",
            "zo.connections_per_server = 17: must be in [1, 16]"},
           {R"("optimizer": {"type": "Lion"}, "zo": {"param_groups": [{}]})",
            "zo.param_groups: per-group hyper-parameters are for Adam and AdamW, not Lion"},
       }) {
    cases.push_back({WithBatch(body), 1, message});
  }
  ExpectInvalid(cases);
}

// torch.optim's param_groups: absent keys take the optimizer's values.
TEST(ConfigTest, ParamGroupsDefaultToTheOptimizersParams) {
  absl::StatusOr<LoadedConfig> loaded = Parse(
      R"("optimizer": {"type": "AdamW", "params": {"betas": [0.8, 0.9], "eps": 1e-6,
                                                   "weight_decay": 0.1}},
         "zo": {"client_lr": true,
                "param_groups": [{}, {"weight_decay": 0}, {"betas": [0.5, 0.6], "eps": 1e-3}]})");
  ASSERT_THAT(loaded.status(), IsOk());
  const Config& c = loaded->config;
  EXPECT_TRUE(c.zo.client_lr);
  ASSERT_EQ(c.zo.param_groups.size(), 3u);
  EXPECT_EQ(c.zo.param_groups[0],
            (ParamGroupConfig{.betas = {0.8, 0.9}, .eps = 1e-6, .weight_decay = 0.1}));
  EXPECT_EQ(c.zo.param_groups[1],
            (ParamGroupConfig{.betas = {0.8, 0.9}, .eps = 1e-6, .weight_decay = 0.0}));
  EXPECT_EQ(c.zo.param_groups[2],
            (ParamGroupConfig{.betas = {0.5, 0.6}, .eps = 1e-3, .weight_decay = 0.1}));
  EXPECT_EQ(ParamGroupsOf(c), c.zo.param_groups);
  // Written out and read back, the same groups.
  absl::StatusOr<LoadedConfig> again = ParseConfig(ConfigToJson(c));
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(again->config, c);
  // None given: one group of the optimizer's params.
  absl::StatusOr<LoadedConfig> plain = Parse(R"("optimizer": {"type": "AdamW"})");
  ASSERT_THAT(plain.status(), IsOk());
  EXPECT_EQ(ParamGroupsOf(plain->config),
            std::vector<ParamGroupConfig>{ParamGroupConfig{.weight_decay = 0.0}});
}

TEST(ConfigTest, MalformedJsonNamesThePosition) {
  EXPECT_THAT(ParseConfig("{\n  \"train_batch_size\": 8,\n}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("malformed JSON"), HasSubstr("line 3, column 1"))));
  EXPECT_THAT(ParseConfig("[1, 2]"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be a JSON object")));
}

TEST(ConfigTest, ServersAcceptHostPortAndBracketedIPv6) {
  ZO_ASSERT_OK_AND_ASSIGN(
      LoadedConfig loaded,
      Parse(R"("zo": {"servers": ["localhost:50051", "10.0.0.2:1", "[::1]:65535"]})"));
  EXPECT_THAT(loaded.config.zo.servers,
              ElementsAre("localhost:50051", "10.0.0.2:1", "[::1]:65535"));
}

TEST(ConfigTest, UnknownKeysAreWarningsNamingTheFullPath) {
  testing::ScopedLogCapture log;
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, Parse(R"("trian_micro_batch": 2,
               "zero_optimization": {"offload_optimizer": {"device": "cpu", "nvme_pth": "/x"}},
               "scheduler": {"type": "WarmupLR", "params": {"total_num_steps": 10}},
               "zo": {"dpu": {"enable": true}})"));
  EXPECT_THAT(
      loaded.warnings,
      UnorderedElementsAre("unknown key 'zero_optimization.offload_optimizer.nvme_pth' ignored",
                           "unknown key 'scheduler.params.total_num_steps' ignored",
                           "unknown key 'zo.dpu.enable' ignored",
                           "unknown key 'trian_micro_batch' ignored"));
  EXPECT_THAT(log.lines(), Contains("WARNING: config: unknown key "
                                    "'zero_optimization.offload_optimizer.nvme_pth' ignored"));
}

TEST(ConfigTest, UnusedDeepSpeedKeysAreNotesNotWarnings) {
  ZO_ASSERT_OK_AND_ASSIGN(
      LoadedConfig loaded,
      Parse(R"("zero_allow_untested_optimizer": true, "prescale_gradients": false,
               "activation_checkpointing": {"partition_activations": true, "anything": 1},
               "communication_data_type": "fp16",
               "zero_optimization": {"stage": 3, "overlap_comm": true, "contiguous_gradients": true,
                                     "reduce_bucket_size": 5e8, "stage3_prefetch_bucket_size": 5e8,
                                     "stage3_param_persistence_threshold": 1e6,
                                     "stage3_max_live_parameters": 3e7})"));
  EXPECT_THAT(loaded.warnings, IsEmpty());
  // The one stage3_ key zo reads: zo-train's window with offload_param.
  EXPECT_EQ(loaded.config.zero_optimization.stage3_max_live_parameters, 30'000'000);
  EXPECT_THAT(loaded.notes, Not(Contains(HasSubstr("stage3_max_live_parameters"))));
  EXPECT_THAT(loaded.notes,
              AllOf(Contains(HasSubstr("'activation_checkpointing' accepted")),
                    Contains(HasSubstr("'zero_optimization.stage3_prefetch_bucket_size'")),
                    Contains(HasSubstr("'zero_optimization.overlap_comm' accepted"))));
}

TEST(ConfigTest, ObsoleteCpuOffloadIsAWarningWithAdvice) {
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded,
                          Parse(R"("zero_optimization": {"stage": 2, "cpu_offload": true})"));
  EXPECT_EQ(loaded.config.zero_optimization.offload_optimizer.device, OffloadDevice::kNone);
  EXPECT_THAT(loaded.warnings, ElementsAre(AllOf(HasSubstr("'zero_optimization.cpu_offload'"),
                                                 HasSubstr("offload_optimizer.device = \"cpu\""))));
}

TEST(ConfigTest, RoundTripKeepsEveryNonDefaultValue) {
  Config c;
  c.train_batch_size = 48;
  c.train_micro_batch_size_per_gpu = 2;
  c.gradient_accumulation_steps = 8;
  c.optimizer = {OptimizerType::kLion,
                 {.lr = 5e-5,
                  .betas = {0.8, 0.99},
                  .eps = 1e-6,
                  .weight_decay = 0.3,
                  .bias_correction = false}};
  c.scheduler = SchedulerConfig{SchedulerType::kWarmupCosineLR,
                                {.warmup_num_steps = 7,
                                 .warmup_type = WarmupType::kLinear,
                                 .total_num_steps = 70,
                                 .warmup_min_ratio = 0.25,
                                 .cos_min_ratio = 0.125}};
  c.fp16 = {true, 64.0, 10, 50, 3, true, 0.5, true};
  c.gradient_clipping = 2.5;
  c.zero_optimization = {3,
                         123456789,
                         {OffloadDevice::kNvme, "/mnt/nvme0", true, 6, true},
                         {OffloadDevice::kCpu, "", true, 7, 1 << 20, 1 << 30}};
  c.aio = {1 << 16, 32, 3, true, false, true};
  c.steps_per_print = 100;
  c.wall_clock_breakdown = true;
  c.zo = {{"a:1", "[::1]:2"},
          1000,
          false,
          {true, 0},
          {"tok", "cert.pem", "key.pem", "ca.pem"},
          7,
          GradientAccumulation::kAuto,
          {},
          false};

  const std::string json = ConfigToJson(c, 2);
  EXPECT_THAT(json, AllOf(HasSubstr("\"type\": \"Lion\""), HasSubstr("\"intra_op_parallelism\""),
                          Not(HasSubstr("thread_count"))));
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, ParseConfig(json, {.dp_world_size = 3}));
  EXPECT_TRUE(loaded.config == c) << json << "\nbecame\n" << ConfigToJson(loaded.config, 2);
  EXPECT_THAT(loaded.warnings, IsEmpty());
}

TEST(ConfigTest, LoadConfigFileErrorsNameThePath) {
  const std::string missing = std::filesystem::temp_directory_path() / "zo_no_such_config.json";
  EXPECT_THAT(LoadConfigFile(missing), StatusIs(absl::StatusCode::kNotFound, HasSubstr(missing)));
  const std::string bad = (std::filesystem::temp_directory_path() / "zo_config_test_bad.json");
  {
    std::ofstream out(bad);
    out << R"({"train_batch_size": 8, "fp16": {"loss_scale": -2}})";
  }
  EXPECT_THAT(LoadConfigFile(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr(bad + ": fp16.loss_scale = -2")));
  std::ofstream(bad) << R"({"train_batch_size": 8,)";
  absl::StatusOr<LoadedConfig> malformed = LoadConfigFile(bad);
  EXPECT_THAT(malformed, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("malformed JSON")));
  EXPECT_THAT(std::string(malformed.status().message()), ::testing::StartsWith(bad + ": "));
  std::filesystem::remove(bad);
}

// zo-train loads the user's file once (its warnings logged once, naming the
// file) and hands ConfigToJson on to the client and the servers, which parse
// it again: that must add no warning or note of its own.
TEST(ConfigTest, LoadedOnceWarnedOnceAndQuietWhenParsedAgain) {
  const std::string path = std::filesystem::temp_directory_path() / "zo_config_test_warn.json";
  std::ofstream(path) << R"({"train_batch_size": 8, "gradient_clipping": 1.0, "optimizer":
      {"type": "AdamW", "params": {"lr": 1e-3, "lr_decay": 0.1}},
      "aio": {"thread_count": 2}, "zo": {"dpu": {"enable": true}}})";
  testing::ScopedLogCapture log;
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig loaded, LoadConfigFile(path, {.dp_world_size = 2}));
  std::filesystem::remove(path);
  EXPECT_THAT(loaded.warnings, Contains("unknown key 'zo.dpu.enable' ignored"));
  ZO_ASSERT_OK_AND_ASSIGN(LoadedConfig again,
                          ParseConfig(ConfigToJson(loaded.config), {.dp_world_size = 2}));
  EXPECT_TRUE(again.config == loaded.config);
  EXPECT_THAT(again.warnings, IsEmpty());
  EXPECT_THAT(again.notes, IsEmpty());
  int unknown = 0;
  for (const std::string& line : log.lines()) {
    unknown += line.find("'zo.dpu.enable'") != std::string::npos;
  }
  EXPECT_EQ(unknown, 1);
  EXPECT_THAT(log.lines(), Contains(HasSubstr(path + ": unknown key 'zo.dpu.enable'")));
}

}  // namespace
}  // namespace zo
