// Loads a DeepSpeed-style JSON config (docs/architecture.md, "Config") into typed,
// validated structs that carry the defaults DeepSpeed applies today. Every key,
// its default and the DeepSpeed surprises are listed in common/config.md.
//
//   ZO_ASSIGN_OR_RETURN(LoadedConfig loaded, LoadConfigFile(path, {.dp_world_size = 4}));
//   const OptimizerParams& adam = loaded.config.optimizer.params;
//
// Errors are INVALID_ARGUMENT naming the key path and the value
// ("optimizer.params.betas[1] = 1.5: must be in [0, 1)"); an unknown key is a
// warning naming its full path.
#ifndef ZO_COMMON_CONFIG_H_
#define ZO_COMMON_CONFIG_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace zo {

enum class OptimizerType { kAdam, kAdamW, kAdagrad, kLion };
enum class SchedulerType { kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };
enum class WarmupType { kLog, kLinear };
enum class OffloadDevice { kNone, kCpu, kNvme };
// `zo.gradient_accumulation`: where a step's micro-batch gradients are summed.
//   kDevice:  fp32 accumulators beside the weights on the worker (4 B/param
//             there), one push per step;
//   kServers: each micro-batch's 16-bit gradients are pushed as they become
//             final and the servers sum them in fp32 (only staging buffers
//             on the worker; traffic x micro-batches);
//   kAuto:    the worker picks (device when it fits) and opens the job with
//             its choice; a server treats it as kDevice.
enum class GradientAccumulation { kAuto, kDevice, kServers };

// zo.dpu.compensation (common/dpu_compensation.h):
//   kNone:   step s computes on w_{s-2} as served;
//   kWorker: on w_{s-2} moved by step s-1's AdamW update, which the worker
//            forms from the last two versions, its own gradient of step
//            s-1 and a gain per tensor the servers send.
enum class DpuCompensation { kNone, kWorker };

// DeepSpeed's spelling of each value: "AdamW", "WarmupLR", "log", "nvme".
std::string_view EnumName(OptimizerType type);
std::string_view EnumName(SchedulerType type);
std::string_view EnumName(WarmupType type);
std::string_view EnumName(OffloadDevice device);
std::string_view EnumName(GradientAccumulation policy);
std::string_view EnumName(DpuCompensation compensation);

// `optimizer.params`. Each type reads the subset it needs (Adagrad: lr, eps,
// weight_decay; Lion: lr, betas, weight_decay).
struct OptimizerParams {
  double lr = 1e-3;                            // >= 0
  std::array<double, 2> betas = {0.9, 0.999};  // each in [0, 1)
  double eps = 1e-8;                           // > 0
  double weight_decay = 0.0;                   // >= 0
  bool bias_correction = true;
  // true: decoupled weight decay (AdamW) even for type Adam, as in DeepSpeed.
  // Always true for type AdamW.
  bool adam_w_mode = true;
  friend bool operator==(const OptimizerParams&, const OptimizerParams&) = default;
};

// `optimizer`. An absent section means {type Adam, default params}.
struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdam;  // required when the section is given
  OptimizerParams params;
  friend bool operator==(const OptimizerConfig&, const OptimizerConfig&) = default;
};

// `scheduler.params`. Fields a type does not read keep their defaults.
struct SchedulerParams {
  double warmup_min_lr = 0.0;       // WarmupLR, WarmupDecayLR; >= 0
  double warmup_max_lr = 1e-3;      // WarmupLR, WarmupDecayLR; >= 0
  int64_t warmup_num_steps = 1000;  // >= 0
  WarmupType warmup_type = WarmupType::kLog;
  // WarmupDecayLR, WarmupCosineLR: required, > warmup_num_steps. 0 otherwise.
  int64_t total_num_steps = 0;
  double warmup_min_ratio = 0.0;  // WarmupCosineLR; in [0, 1]
  double cos_min_ratio = 1e-4;    // WarmupCosineLR; in [0, 1]
  friend bool operator==(const SchedulerParams&, const SchedulerParams&) = default;
};

// `scheduler`. No section means a constant learning rate.
struct SchedulerConfig {
  SchedulerType type = SchedulerType::kWarmupLR;  // required
  SchedulerParams params;
  friend bool operator==(const SchedulerConfig&, const SchedulerConfig&) = default;
};

// `fp16`: mixed precision with loss scaling.
struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0.0;              // 0: dynamic; > 0: static scale
  int initial_scale_power = 16;         // dynamic scale starts at 2^this; in [0, 127]
  int loss_scale_window = 1000;         // overflow-free steps before the scale doubles; >= 1
  int hysteresis = 2;                   // overflows tolerated before the scale halves; >= 1
  bool consecutive_hysteresis = false;  // refill hysteresis after each good step
  double min_loss_scale = 1.0;          // > 0
  bool auto_cast = false;
  friend bool operator==(const Fp16Config&, const Fp16Config&) = default;
};

// `bf16` (DeepSpeed also reads the older name `bfloat16`). No loss scaling.
struct Bf16Config {
  bool enabled = false;
  friend bool operator==(const Bf16Config&, const Bf16Config&) = default;
};

// `zero_optimization.offload_optimizer`.
struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;  // required for device nvme
  bool pin_memory = false;
  int buffer_count = 4;  // >= 1; >= 3 for nvme (read, update and write in flight)
  bool fast_init = false;
  friend bool operator==(const OffloadOptimizerConfig&, const OffloadOptimizerConfig&) = default;
};

// `zero_optimization.offload_param`.
struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;  // required for device nvme
  bool pin_memory = false;
  int buffer_count = 5;                // >= 1
  int64_t buffer_size = 100'000'000;   // elements; > 0
  int64_t max_in_cpu = 1'000'000'000;  // elements; >= 0
  friend bool operator==(const OffloadParamConfig&, const OffloadParamConfig&) = default;
};

// `zero_optimization`.
struct ZeroConfig {
  int stage = 0;                           // in [0, 3]
  int64_t sub_group_size = 1'000'000'000;  // elements per NVMe sub-group; > 0
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
  // With offload_param: the most parameters of a worker's stage on the
  // device at once (zo-train streams whole layers through that window).
  int64_t stage3_max_live_parameters = 1'000'000'000;  // > 0
  friend bool operator==(const ZeroConfig&, const ZeroConfig&) = default;
};

// `aio`: the NVMe I/O engine.
struct AioConfig {
  int64_t block_size = 1'048'576;  // bytes; a power of two >= 4096
  int queue_depth = 8;             // >= 1
  int intra_op_parallelism = 1;    // >= 1; DeepSpeed's old name: thread_count
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;
  friend bool operator==(const AioConfig&, const AioConfig&) = default;
};

// `zo.dpu`: delayed parameter update (docs/architecture.md, "One training step").
struct DpuConfig {
  bool enabled = false;
  int warmup_steps = 40;  // steps that wait for v_t before step t+1; >= 0
  DpuCompensation compensation = DpuCompensation::kNone;
  friend bool operator==(const DpuConfig&, const DpuConfig&) = default;
};

// `zo.auth`: file paths; empty means unused.
struct AuthConfig {
  std::string token_file;
  std::string tls_cert;  // requires tls_key, and the other way round
  std::string tls_key;
  std::string tls_ca;
  friend bool operator==(const AuthConfig&, const AuthConfig&) = default;
};

// One entry of `zo.param_groups`: the hyper-parameters of the tensors whose
// manifest entry names this group (TensorSpec::group). Absent keys take
// `optimizer.params`' values when the config is parsed. A group's learning
// rate is not here: with zo.client_lr each step's rate of every group comes
// from the worker (zo.torch's param_groups), otherwise from the schedule.
struct ParamGroupConfig {
  std::array<double, 2> betas = {0.9, 0.999};  // each in [0, 1)
  double eps = 1e-8;                           // > 0
  double weight_decay = 0.0;                   // >= 0
  friend bool operator==(const ParamGroupConfig&, const ParamGroupConfig&) = default;
};

// `zo`: what DeepSpeed has no key for.
struct ZoConfig {
  // "host:port" ("[::1]:port" for IPv6), distinct; empty: an embedded server.
  std::vector<std::string> servers;
  int64_t chunk_elems = 4 << 20;  // elements per shard chunk; > 0
  // Checksum every block of NVMe swap files (verified on read). Off for
  // benchmarking only: corruption then goes undetected.
  bool nvme_checksums = true;
  DpuConfig dpu;
  AuthConfig auth;
  // Consecutive steps skipped for non-finite gradients at a loss scale that
  // cannot go lower (fp16.min_loss_scale, a static scale, or none at all)
  // before the job fails; 0: never. DeepSpeed fails at the first such step.
  int64_t max_consecutive_skips = 100;  // >= 0
  GradientAccumulation gradient_accumulation = GradientAccumulation::kAuto;
  // Group 0 is the optimizer's own params when this is empty; otherwise
  // group i is param_groups[i] and every tensor names one.
  std::vector<ParamGroupConfig> param_groups;
  // Each step's learning rates (one per group) come from the worker
  // (OffloadClient::SetStepLr), as torch.optim's param_groups[i]["lr"] does;
  // refused together with a `scheduler`.
  bool client_lr = false;
  // Each server updates a chunk as soon as its gradients are all in,
  // before the step is decided, and keeps the update only if the decision
  // is what it assumed (applied, unclipped); otherwise it updates again.
  // Bit for bit the same either way; on where the job can do it exactly
  // (server/job.h), and false turns it off.
  bool speculative_update = true;
  // TCP connections a worker opens to each server it reaches over gRPC,
  // its pushes and pulls striped over them by chunk. The worker's own
  // choice: not part of the job (JobSpecFromRequest drops it).
  int64_t connections_per_server = kDefaultConnectionsPerServer;
  static constexpr int64_t kDefaultConnectionsPerServer = 2;
  static constexpr int64_t kMaxConnectionsPerServer = 16;
  friend bool operator==(const ZoConfig&, const ZoConfig&) = default;
};

struct Config {
  // Always resolved (>= 1) by ParseConfig, so that train_batch_size ==
  // micro * gradient_accumulation_steps * dp_world_size.
  int64_t train_batch_size = 0;
  int64_t train_micro_batch_size_per_gpu = 0;
  int64_t gradient_accumulation_steps = 0;
  OptimizerConfig optimizer;
  std::optional<SchedulerConfig> scheduler;  // nullopt: constant lr
  Fp16Config fp16;
  Bf16Config bf16;                 // at most one of fp16 and bf16 is enabled
  double gradient_clipping = 0.0;  // global L2 norm limit; 0 (DeepSpeed's default) disables
  ZeroConfig zero_optimization;
  AioConfig aio;
  int steps_per_print = 10;  // >= 1
  bool wall_clock_breakdown = false;
  ZoConfig zo;
  friend bool operator==(const Config&, const Config&) = default;
};

// The groups a job's tensors may name: zo.param_groups, or one group of the
// optimizer's params when it is empty.
std::vector<ParamGroupConfig> ParamGroupsOf(const Config& config);

struct ConfigOptions {
  int dp_world_size = 1;  // data-parallel replicas, for the batch-size rule; >= 1
  // Warnings at WARNING and notes at INFO in the log; off where the caller
  // reports them its own way (Python's warnings module).
  bool log_diagnostics = true;
};

struct LoadedConfig {
  Config config;
  // Unknown keys, renamed keys, settings overridden: worth a person's look.
  // Each is also logged at WARNING.
  std::vector<std::string> warnings;
  // DeepSpeed keys accepted with no effect in zo, and defaults worth knowing
  // about. Each is also logged at INFO.
  std::vector<std::string> notes;
};

// Parses a config from JSON text. INVALID_ARGUMENT for malformed JSON (with
// the parser's position), a wrong type, a missing required value or an
// impossible value.
absl::StatusOr<LoadedConfig> ParseConfig(const std::string& json_text,
                                         const ConfigOptions& options = {});

// Reads and parses the file at `path`: NOT_FOUND when it does not exist,
// otherwise as ParseConfig; error messages start with the path.
absl::StatusOr<LoadedConfig> LoadConfigFile(const std::string& path,
                                            const ConfigOptions& options = {});

// The config as JSON that ParseConfig (with the same dp_world_size) turns back
// into an equal Config. indent < 0: one line.
std::string ConfigToJson(const Config& config, int indent = -1);

// Gradient pushes each dp rank makes per step: gradient_accumulation_steps
// with zo.gradient_accumulation "servers", else 1.
int64_t PushesPerRank(const Config& config);

// `json_text` (a config ParseConfig accepts) with zo.gradient_accumulation
// set to `policy`, every other key as it was: how a worker opens a job with
// the policy it chose for "auto".
absl::StatusOr<std::string> WithGradientAccumulation(const std::string& json_text,
                                                     GradientAccumulation policy);

}  // namespace zo

#endif  // ZO_COMMON_CONFIG_H_
