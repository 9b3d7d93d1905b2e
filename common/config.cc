#include "common/config.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/internal/config_rules.h"
#include "common/internal/json_fields.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace zo {
namespace {

using config_internal::Above;
using config_internal::AtLeast;
using config_internal::CheckAcrossKeys;
using config_internal::Diagnostics;
using config_internal::EnumEntry;
using config_internal::IfAbsent;
using config_internal::InHalfOpenRange;
using config_internal::InRange;
using config_internal::Json;
using config_internal::JsonReader;
using config_internal::JsonWriter;
using config_internal::ResolveBatchSizes;

constexpr std::array<EnumEntry<OptimizerType>, 4> kOptimizerTypes = {{
    {OptimizerType::kAdam, "Adam"},
    {OptimizerType::kAdamW, "AdamW"},
    {OptimizerType::kAdagrad, "Adagrad"},
    {OptimizerType::kLion, "Lion"},
}};
constexpr std::array<EnumEntry<SchedulerType>, 3> kSchedulerTypes = {{
    {SchedulerType::kWarmupLR, "WarmupLR"},
    {SchedulerType::kWarmupDecayLR, "WarmupDecayLR"},
    {SchedulerType::kWarmupCosineLR, "WarmupCosineLR"},
}};
constexpr std::array<EnumEntry<WarmupType>, 2> kWarmupTypes = {{
    {WarmupType::kLog, "log"},
    {WarmupType::kLinear, "linear"},
}};
constexpr std::array<EnumEntry<OffloadDevice>, 3> kOffloadDevices = {{
    {OffloadDevice::kNone, "none"},
    {OffloadDevice::kCpu, "cpu"},
    {OffloadDevice::kNvme, "nvme"},
}};
constexpr std::array<EnumEntry<GradientAccumulation>, 3> kGradientAccumulations = {{
    {GradientAccumulation::kAuto, "auto"},
    {GradientAccumulation::kDevice, "device"},
    {GradientAccumulation::kServers, "servers"},
}};
constexpr std::array<EnumEntry<DpuCompensation>, 2> kDpuCompensations = {{
    {DpuCompensation::kNone, "none"},
    {DpuCompensation::kWorker, "worker"},
}};

// DeepSpeed keys that zo accepts and does not use (each one logs a note).
// Whole sections: nothing inside them is checked.
// clang-format off
constexpr std::string_view kIgnoredTopLevelKeys[] = {
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "activation_checkpointing",
    "flops_profiler", "prescale_gradients", "gradient_predivide_factor",
    "communication_data_type", "sparse_gradients", "tensorboard", "wandb", "csv_monitor",
    "comms_logger", "memory_breakdown", "dump_state", "checkpoint", "data_types", "autotuning",
    "elasticity", "compression_training", "data_efficiency", "curriculum_learning",
    "pipeline", "sparse_attention"};
// clang-format on

// ZeRO-1 era names that DeepSpeed dropped; silently ignoring them would hide
// that offloading is off.
constexpr std::pair<const char*, const char*> kObsoleteZeroKeys[] = {
    {"cpu_offload", "use zero_optimization.offload_optimizer.device = \"cpu\""},
    {"cpu_offload_params", "use zero_optimization.offload_param.device = \"cpu\""},
    {"cpu_offload_use_pin_memory", "use offload_optimizer.pin_memory / offload_param.pin_memory"},
};

template <typename E, size_t N>
std::string Choices(const std::array<EnumEntry<E>, N>& names) {
  return absl::StrCat("(", config_internal::OneOf(config_internal::NamesOf(names)), ")");
}

// O_DIRECT wants aligned, power-of-two transfers.
std::string CheckBlockSize(int64_t bytes) {
  if (bytes >= 4096 && (bytes & (bytes - 1)) == 0) return {};
  return "must be a power of two >= 4096";
}

// "host:port", or "[v6 address]:port"; the port in [1, 65535].
std::string CheckHostPort(const std::string& server) {
  if (ParseHostPort(server, PortUse::kConnect).ok()) return {};
  return "must be " + HostPortRule(PortUse::kConnect);
}

// The schema: one function per JSON object, shared by JsonReader (parse) and
// JsonWriter (ConfigToJson). See common/config.md for the why of each default.

template <typename V>
void VisitOptimizerParams(V& v, OptimizerParams& p) {
  v.Field("lr", p.lr, AtLeast(0));
  v.Field("betas", p.betas, InHalfOpenRange(0, 1));
  v.Field("eps", p.eps, Above(0));
  v.Field("weight_decay", p.weight_decay, AtLeast(0));
  v.Field("bias_correction", p.bias_correction);
  v.Field("adam_w_mode", p.adam_w_mode);
  bool amsgrad = false;  // read only to reject it
  v.Field("amsgrad", amsgrad, [](bool on) { return on ? "not supported" : ""; });
}

template <typename V>
void VisitOptimizer(V& v, OptimizerConfig& o) {
  v.Require("type", Choices(kOptimizerTypes));
  v.Enum("type", o.type, kOptimizerTypes);
  v.Object("params", o.params, VisitOptimizerParams<V>);
}

template <typename V>
void VisitSchedulerParams(V& v, SchedulerType type, SchedulerParams& p) {
  const bool cosine = type == SchedulerType::kWarmupCosineLR;
  if (!cosine) {  // WarmupCosineLR warms up towards the optimizer's lr instead
    v.Field("warmup_min_lr", p.warmup_min_lr, AtLeast(0));
    v.Field("warmup_max_lr", p.warmup_max_lr, AtLeast(0));
  }
  v.Field("warmup_num_steps", p.warmup_num_steps, AtLeast(0));
  if (!v.Given("warmup_type")) {
    v.Note("scheduler.params.warmup_type defaults to \"log\" in DeepSpeed, not \"linear\"");
  }
  v.Enum("warmup_type", p.warmup_type, kWarmupTypes);
  if (type != SchedulerType::kWarmupLR) {
    v.Require("total_num_steps", absl::StrCat("for ", std::string(EnumName(type))));
    v.Field("total_num_steps", p.total_num_steps, AtLeast(1));
  }
  if (cosine) {
    v.Field("warmup_min_ratio", p.warmup_min_ratio, InRange(0, 1));
    v.Field("cos_min_ratio", p.cos_min_ratio, InRange(0, 1));
  }
  v.Ignore({"last_batch_iteration"});
}

template <typename V>
void VisitScheduler(V& v, SchedulerConfig& s) {
  v.Require("type", Choices(kSchedulerTypes));
  v.Enum("type", s.type, kSchedulerTypes);
  v.Object("params", s.params,
           [&s](V& params_v, SchedulerParams& p) { VisitSchedulerParams(params_v, s.type, p); });
}

template <typename V>
void VisitFp16(V& v, Fp16Config& f) {
  v.Field("enabled", f.enabled);
  v.Field("loss_scale", f.loss_scale, AtLeast(0));
  v.Field("initial_scale_power", f.initial_scale_power, InRange(0, 127));  // fp32 range
  v.Field("loss_scale_window", f.loss_scale_window, AtLeast(1));
  v.Field("hysteresis", f.hysteresis, AtLeast(1));
  v.Field("consecutive_hysteresis", f.consecutive_hysteresis);
  v.Field("min_loss_scale", f.min_loss_scale, Above(0));
  v.Field("auto_cast", f.auto_cast);
  v.Ignore({"fp16_master_weights_and_grads"});
}

template <typename V>
void VisitBf16(V& v, Bf16Config& b) {
  v.Field("enabled", b.enabled);
}

// The keys both offload sections share.
template <typename V, typename S>
void VisitOffloadTarget(V& v, S& s) {
  v.Enum("device", s.device, kOffloadDevices);
  v.Field("nvme_path", s.nvme_path);
  v.Field("pin_memory", s.pin_memory);
  v.Field("buffer_count", s.buffer_count, AtLeast(1));
}

template <typename V>
void VisitOffloadOptimizer(V& v, OffloadOptimizerConfig& o) {
  VisitOffloadTarget(v, o);
  v.Field("fast_init", o.fast_init);
  v.Ignore({"ratio", "pipeline", "pipeline_read", "pipeline_write"});
}

template <typename V>
void VisitOffloadParam(V& v, OffloadParamConfig& o) {
  VisitOffloadTarget(v, o);
  v.Field("buffer_size", o.buffer_size, Above(0));
  v.Field("max_in_cpu", o.max_in_cpu, AtLeast(0));
}

template <typename V>
void VisitZero(V& v, ZeroConfig& z) {
  v.Field("stage", z.stage, InRange(0, 3));
  v.Field("sub_group_size", z.sub_group_size, Above(0));
  v.Object("offload_optimizer", z.offload_optimizer, VisitOffloadOptimizer<V>);
  v.Object("offload_param", z.offload_param, VisitOffloadParam<V>);
  for (const auto& [key, advice] : kObsoleteZeroKeys) v.Obsolete(key, advice);
  v.Ignore({"overlap_comm", "contiguous_gradients", "reduce_bucket_size", "reduce_scatter",
            "allgather_partitions", "allgather_bucket_size", "round_robin_gradients",
            "elastic_checkpoint", "load_from_fp32_weights", "ignore_unused_parameters",
            "memory_efficient_linear", "zero_hpz_partition_size", "zero_quantized_weights",
            "zero_quantized_gradients", "mics_shard_size"});
  v.Field("stage3_max_live_parameters", z.stage3_max_live_parameters, Above(0));
  v.IgnorePrefix("stage3_");
}

template <typename V>
void VisitAio(V& v, AioConfig& a) {
  v.Field("block_size", a.block_size, CheckBlockSize);
  v.Field("queue_depth", a.queue_depth, AtLeast(1));
  v.Rename("thread_count", "intra_op_parallelism", /*warn=*/true);
  v.Field("intra_op_parallelism", a.intra_op_parallelism, AtLeast(1));
  v.Field("single_submit", a.single_submit);
  v.Field("overlap_events", a.overlap_events);
  v.Field("use_gds", a.use_gds);
}

template <typename V>
void VisitDpu(V& v, DpuConfig& d) {
  v.Field("enabled", d.enabled);
  v.Field("warmup_steps", d.warmup_steps, AtLeast(0));
  v.Enum("compensation", d.compensation, kDpuCompensations);
}

template <typename V>
void VisitAuth(V& v, AuthConfig& a) {
  v.Field("token_file", a.token_file);
  v.Field("tls_cert", a.tls_cert);
  v.Field("tls_key", a.tls_key);
  v.Field("tls_ca", a.tls_ca);
}

// Its lr is the worker's (zo.client_lr): refused here so a config that sets
// it does not read as if the servers used it.
template <typename V>
void VisitParamGroup(V& v, ParamGroupConfig& g) {
  v.Field("betas", g.betas, InHalfOpenRange(0, 1));
  v.Field("eps", g.eps, Above(0));
  v.Field("weight_decay", g.weight_decay, AtLeast(0));
  if constexpr (std::is_same_v<V, JsonReader>) {  // read only to reject it; never written
    double lr = 0.0;
    v.Field("lr", lr, [](double) {
      return "a group's learning rate is not part of the config: with zo.client_lr the worker "
             "sends every group's rate each step, otherwise every group follows the optimizer's "
             "lr and scheduler";
    });
  }
}

template <typename V>
void VisitZo(V& v, ZoConfig& z, const OptimizerParams& defaults) {
  v.Field("servers", z.servers, CheckHostPort);
  v.Field("chunk_elems", z.chunk_elems, Above(0));
  v.Field("nvme_checksums", z.nvme_checksums);
  if (!z.nvme_checksums) {
    v.Note("zo.nvme_checksums is false: swap-file corruption will go undetected (benchmarks only)");
  }
  v.Field("max_consecutive_skips", z.max_consecutive_skips, AtLeast(0));
  v.Enum("gradient_accumulation", z.gradient_accumulation, kGradientAccumulations);
  v.Object("dpu", z.dpu, VisitDpu<V>);
  v.Object("auth", z.auth, VisitAuth<V>);
  v.ObjectArray(
      "param_groups", z.param_groups,
      ParamGroupConfig{
          .betas = defaults.betas, .eps = defaults.eps, .weight_decay = defaults.weight_decay},
      VisitParamGroup<V>);
  v.Field("client_lr", z.client_lr);
  v.Field("speculative_update", z.speculative_update);
  v.Field("connections_per_server", z.connections_per_server,
          InRange(1, ZoConfig::kMaxConnectionsPerServer));
}

template <typename V>
void VisitConfig(V& v, Config& c) {
  v.AutoField("train_batch_size", c.train_batch_size, AtLeast(1));
  v.AutoField("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu, AtLeast(1));
  v.AutoField("gradient_accumulation_steps", c.gradient_accumulation_steps, AtLeast(1));
  if (!v.Given("optimizer")) {
    v.Note("no optimizer section: using type Adam with DeepSpeed's defaults (adam_w_mode true)");
  }
  v.Object("optimizer", c.optimizer, VisitOptimizer<V>, IfAbsent::kSkip);
  v.OptionalObject("scheduler", c.scheduler, VisitScheduler<V>);
  v.Object("fp16", c.fp16, VisitFp16<V>);
  v.Rename("bfloat16", "bf16", /*warn=*/false);  // both spellings are current in DeepSpeed
  v.Object("bf16", c.bf16, VisitBf16<V>);
  if (!v.Given("gradient_clipping")) {
    // DeepSpeed's documentation says 1.0; its code (GRADIENT_CLIPPING_DEFAULT)
    // says 0.0, and the code is what trains.
    v.Note(
        "no gradient_clipping: gradients are not clipped (DeepSpeed's code default 0.0, "
        "though its documentation says 1.0)");
  }
  v.Field("gradient_clipping", c.gradient_clipping, AtLeast(0));
  v.Object("zero_optimization", c.zero_optimization, VisitZero<V>);
  v.Object("aio", c.aio, VisitAio<V>);
  v.Field("steps_per_print", c.steps_per_print, AtLeast(1));
  v.Field("wall_clock_breakdown", c.wall_clock_breakdown);
  v.Object("zo", c.zo, [&c](V& zo_v, ZoConfig& z) { VisitZo(zo_v, z, c.optimizer.params); });
  v.Ignore(kIgnoredTopLevelKeys);
}

absl::StatusOr<Json> ParseJson(const std::string& text) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    // what() is "[json.exception.parse_error.101] parse error at line 1, column 2: ...".
    std::string what = e.what();
    const size_t tag_end = what.find("] ");
    if (tag_end != std::string::npos) what = what.substr(tag_end + 2);
    return absl::InvalidArgumentError(absl::StrCat("malformed JSON: ", what));
  }
}

absl::StatusOr<LoadedConfig> Parse(const std::string& json_text, const ConfigOptions& options) {
  if (options.dp_world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp_world_size = ", options.dp_world_size, ": must be >= 1"));
  }
  ZO_ASSIGN_OR_RETURN(const Json json, ParseJson(json_text));
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a config must be a JSON object, not ", json.type_name()));
  }
  Diagnostics diag;
  LoadedConfig loaded;
  JsonReader reader(json, "", &diag);
  VisitConfig(reader, loaded.config);
  reader.Finish();
  ZO_RETURN_IF_ERROR(diag.status);
  ZO_RETURN_IF_ERROR(ResolveBatchSizes(options.dp_world_size, loaded.config));
  ZO_RETURN_IF_ERROR(CheckAcrossKeys(loaded.config, diag));
  loaded.warnings = std::move(diag.warnings);
  loaded.notes = std::move(diag.notes);
  return loaded;
}

void LogDiagnostics(const LoadedConfig& loaded, const std::string& source) {
  for (const std::string& warning : loaded.warnings) ZO_LOG(WARNING) << source << ": " << warning;
  for (const std::string& note : loaded.notes) ZO_LOG(INFO) << source << ": " << note;
}

}  // namespace

std::string_view EnumName(OptimizerType type) { return NameOf(kOptimizerTypes, type); }
std::string_view EnumName(SchedulerType type) { return NameOf(kSchedulerTypes, type); }
std::string_view EnumName(WarmupType type) { return NameOf(kWarmupTypes, type); }
std::string_view EnumName(OffloadDevice device) { return NameOf(kOffloadDevices, device); }
std::string_view EnumName(GradientAccumulation policy) {
  return NameOf(kGradientAccumulations, policy);
}
std::string_view EnumName(DpuCompensation compensation) {
  return NameOf(kDpuCompensations, compensation);
}

absl::StatusOr<LoadedConfig> ParseConfig(const std::string& json_text,
                                         const ConfigOptions& options) {
  ZO_ASSIGN_OR_RETURN(LoadedConfig loaded, Parse(json_text, options));
  if (options.log_diagnostics) LogDiagnostics(loaded, "config");
  return loaded;
}

absl::StatusOr<LoadedConfig> LoadConfigFile(const std::string& path, const ConfigOptions& options) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not a config file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) {
    const int err = errno;
    const std::string message =
        absl::StrCat("cannot open config file ", path, ": ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(message);
    return absl::FailedPreconditionError(message);
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::FailedPreconditionError(absl::StrCat("cannot read ", path));
  absl::StatusOr<LoadedConfig> loaded = Parse(text, options);
  if (!loaded.ok()) {
    return absl::Status(loaded.status().code(),
                        absl::StrCat(path, ": ", loaded.status().message()));
  }
  if (options.log_diagnostics) LogDiagnostics(*loaded, path);
  return loaded;
}

std::vector<ParamGroupConfig> ParamGroupsOf(const Config& config) {
  if (!config.zo.param_groups.empty()) return config.zo.param_groups;
  const OptimizerParams& p = config.optimizer.params;
  return {ParamGroupConfig{.betas = p.betas, .eps = p.eps, .weight_decay = p.weight_decay}};
}

int64_t PushesPerRank(const Config& config) {
  return config.zo.gradient_accumulation == GradientAccumulation::kServers
             ? config.gradient_accumulation_steps
             : 1;
}

absl::StatusOr<std::string> WithGradientAccumulation(const std::string& json_text,
                                                     GradientAccumulation policy) {
  ZO_ASSIGN_OR_RETURN(Json json, ParseJson(json_text));
  if (!json.is_object()) return absl::InvalidArgumentError("a config must be a JSON object");
  Json& zo = json["zo"];
  if (!zo.is_null() && !zo.is_object()) return absl::InvalidArgumentError("zo must be an object");
  zo["gradient_accumulation"] = std::string(EnumName(policy));
  return json.dump();
}

std::string ConfigToJson(const Config& config, int indent) {
  Config copy = config;  // the schema functions take mutable structs, for the reader
  JsonWriter writer;
  VisitConfig(writer, copy);
  return writer.json().dump(indent);
}

}  // namespace zo
