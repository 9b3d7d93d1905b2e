// zo-ctl estimate: memory per GPU, per server RAM and per server NVMe
// (common/memory_estimate.h), from flags and optionally a config.
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/manifest_file.h"
#include "common/memory_estimate.h"
#include "common/sharding.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "ctl/commands.h"

ABSL_FLAG(std::string, params, "", "estimate: total parameter count, e.g. 13B, 350M, 7e9");
ABSL_FLAG(std::string, manifest, "",
          "estimate: model manifest JSON ({\"tensors\": [{\"name\", \"shape\"}]}) instead of "
          "--params; stages are then balanced over whole tensors");
ABSL_FLAG(int, pipeline_stages, 1, "estimate: pipeline stages per model replica");
ABSL_FLAG(int, dp, 1, "estimate: data-parallel ranks, i.e. GPUs per stage");
ABSL_FLAG(std::string, servers, "1",
          "estimate: offload servers the optimizer state is striped over (a count); rescale: the "
          "job's new servers, HOST:PORT,... in striping order");
ABSL_FLAG(std::string, precision, "fp16", "estimate: fp16 or bf16");
ABSL_FLAG(bool, nvme, false, "estimate: optimizer state (master, m, v) on NVMe");
ABSL_FLAG(bool, dpu, false,
          "estimate: the delayed parameter update (zo.dpu): with state in RAM it costs no "
          "memory (the previous version is recomputed); with NVMe it is part of the two "
          "stored 16-bit versions");
ABSL_FLAG(bool, dpu_compensation, false,
          "estimate: zo.dpu.compensation \"worker\": each GPU keeps the last two versions it "
          "pulled beside its weights (two more 16-bit copies of its stage, gradients summed on "
          "the device only)");
ABSL_FLAG(bool, speculative_update, true,
          "estimate: the speculative update (zo.speculative_update): with state in RAM and no "
          "DPU a server keeps a second copy of the optimizer state (12 bytes per element); "
          "one whose host cannot take it does not speculate");
ABSL_FLAG(std::string, chunk_elems, "4194304",
          "estimate: elements per chunk (zo.chunk_elems); counts like 4M or 1e8 work");
ABSL_FLAG(std::string, sub_group_size, "1e9",
          "estimate: elements per NVMe sub-group (zero_optimization.sub_group_size)");
ABSL_FLAG(int, buffer_count, 4, "estimate: NVMe swap buffers (offload_optimizer.buffer_count)");
ABSL_FLAG(int, micro_batches, 1,
          "estimate: micro-batches per step (gradient_accumulation_steps): what "
          "zo.gradient_accumulation \"servers\" multiplies the pushed bytes by");
ABSL_FLAG(std::string, max_live_params, "0",
          "estimate: parameters of a stage kept on the device while the rest stream from "
          "host memory (zero_optimization.offload_param \"cpu\" with "
          "stage3_max_live_parameters); 0: no streaming; counts like 2B or 5e8 work");
ABSL_FLAG(std::string, param_nvme_buffer, "0",
          "estimate: with --max-live-params, keep the streamed weights in a file on the "
          "worker's NVMe, pulled through a buffer of this many parameters "
          "(zero_optimization.offload_param \"nvme\" with buffer_size); 0: in host memory");
ABSL_FLAG(std::string, config, "",
          "estimate: DeepSpeed-style JSON config supplying precision, NVMe offload, "
          "sub_group_size, buffer_count, chunk_elems, the server count and parameter "
          "streaming; flags set to other than their defaults override it");

namespace zo::ctl {
namespace {

// Sets each estimate flag still at its default from `config`, so that flags
// given on the command line win.
template <typename T>
void SetIfDefault(absl::Flag<T>& flag, const T& value) {
  const absl::CommandLineFlag& handle = absl::GetFlagReflectionHandle(flag);
  if (handle.CurrentValue() == handle.DefaultValue()) absl::SetFlag(&flag, value);
}

void ApplyConfigDefaults(const Config& config) {
  SetIfDefault(FLAGS_precision, std::string(config.bf16.enabled ? "bf16" : "fp16"));
  SetIfDefault(FLAGS_nvme,
               config.zero_optimization.offload_optimizer.device == OffloadDevice::kNvme);
  SetIfDefault(FLAGS_sub_group_size, absl::StrCat(config.zero_optimization.sub_group_size));
  SetIfDefault(FLAGS_dpu, config.zo.dpu.enabled);
  SetIfDefault(FLAGS_dpu_compensation, config.zo.dpu.compensation != DpuCompensation::kNone);
  SetIfDefault(FLAGS_speculative_update, config.zo.speculative_update);
  SetIfDefault(FLAGS_buffer_count, config.zero_optimization.offload_optimizer.buffer_count);
  SetIfDefault(FLAGS_chunk_elems, absl::StrCat(config.zo.chunk_elems));
  SetIfDefault(FLAGS_micro_batches, static_cast<int>(config.gradient_accumulation_steps));
  const OffloadParamConfig& param = config.zero_optimization.offload_param;
  if (param.device != OffloadDevice::kNone) {
    SetIfDefault(FLAGS_max_live_params,
                 absl::StrCat(config.zero_optimization.stage3_max_live_parameters));
  }
  if (param.device == OffloadDevice::kNvme) {
    SetIfDefault(FLAGS_param_nvme_buffer, absl::StrCat(param.buffer_size));
  }
  if (!config.zo.servers.empty()) {
    SetIfDefault(FLAGS_servers, absl::StrCat(config.zo.servers.size()));
  }
}

absl::StatusOr<EstimateInput> EstimateInputFromFlags() {
  EstimateInput in;
  const std::string params = absl::GetFlag(FLAGS_params);
  const std::string manifest = absl::GetFlag(FLAGS_manifest);
  if (params.empty() == manifest.empty()) {
    return absl::InvalidArgumentError("give exactly one of --params and --manifest");
  }
  if (!params.empty()) {
    ZO_ASSIGN_OR_RETURN(int64_t n, ParseCount(params));
    in.tensor_elems = {n};
  } else {
    ZO_ASSIGN_OR_RETURN(std::vector<TensorSpec> specs, LoadManifestFile(manifest));
    for (const TensorSpec& t : specs) in.tensor_elems.push_back(NumElements(t.shape));
    if (in.tensor_elems.empty()) return absl::InvalidArgumentError(manifest + " has no tensors");
  }
  if (!absl::GetFlag(FLAGS_config).empty()) {
    ZO_ASSIGN_OR_RETURN(LoadedConfig loaded, LoadConfigFile(absl::GetFlag(FLAGS_config)));
    ApplyConfigDefaults(loaded.config);
  }
  const std::optional<DType> precision = ParseDType(absl::GetFlag(FLAGS_precision));
  if (!precision || *precision == DType::kFloat32) {
    return absl::InvalidArgumentError("--precision must be fp16 or bf16, got '" +
                                      absl::GetFlag(FLAGS_precision) + "'");
  }
  in.precision = *precision;
  in.pipeline_stages = absl::GetFlag(FLAGS_pipeline_stages);
  in.dp_ranks = absl::GetFlag(FLAGS_dp);
  if (!absl::SimpleAtoi(absl::GetFlag(FLAGS_servers), &in.servers)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "estimate: --servers is a count of servers, got '", absl::GetFlag(FLAGS_servers), "'"));
  }
  in.nvme = absl::GetFlag(FLAGS_nvme);
  in.dpu = absl::GetFlag(FLAGS_dpu);
  in.dpu_compensation = absl::GetFlag(FLAGS_dpu_compensation);
  in.speculative_update = absl::GetFlag(FLAGS_speculative_update);
  ZO_ASSIGN_OR_RETURN(in.chunk_elems, ParseCount(absl::GetFlag(FLAGS_chunk_elems)));
  ZO_ASSIGN_OR_RETURN(in.sub_group_size, ParseCount(absl::GetFlag(FLAGS_sub_group_size)));
  in.buffer_count = absl::GetFlag(FLAGS_buffer_count);
  in.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  if (const std::string live = absl::GetFlag(FLAGS_max_live_params); live != "0") {
    ZO_ASSIGN_OR_RETURN(in.max_live_params, ParseCount(live));
  }
  if (const std::string buffer = absl::GetFlag(FLAGS_param_nvme_buffer); buffer != "0") {
    ZO_ASSIGN_OR_RETURN(in.param_nvme_buffer_elems, ParseCount(buffer));
  }
  return in;
}

}  // namespace

int RunEstimate() {
  absl::StatusOr<EstimateInput> in = EstimateInputFromFlags();
  absl::StatusOr<MemoryEstimate> estimate =
      in.ok() ? EstimateMemory(*in) : absl::StatusOr<MemoryEstimate>(in.status());
  if (!estimate.ok()) {
    std::cerr << "zo-ctl estimate: " << estimate.status().message() << "\n";
    return 2;
  }
  std::cout << (absl::GetFlag(FLAGS_json) ? FormatEstimateJson(*estimate)
                                          : FormatEstimateTable(*estimate));
  return 0;
}

}  // namespace zo::ctl
