#include "common/memory_estimate.h"

#include <algorithm>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/sharding.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "nlohmann/json.hpp"

namespace zo {
namespace {

// Bytes per element of the fp32 optimizer state.
constexpr int64_t kMasterBytes = 4;
constexpr int64_t kMomentBytes = 8;     // m and v
constexpr int64_t kGradAccumBytes = 4;  // fp32 sum over dp ranks
// Beyond any model (281 T parameters) and small enough that every byte
// count below, NVMe buffers included, fits an int64.
constexpr int64_t kMaxParams = int64_t{1} << 48;
constexpr int kMaxBufferCount = 1024;

// Stored low-precision versions per element, as the server's ParamVersions
// holds them: none with the master in RAM (pulls round it; with DPU the
// version before the latest is recomputed by undoing the step, plus a few
// corrections), both with the master on NVMe.
int LowPrecisionCopies(const EstimateInput& in) { return in.nvme ? 2 : 0; }

// Whether `sizes` splits into at most `parts` contiguous groups none larger
// than `cap`.
bool FitsIn(const std::vector<int64_t>& sizes, int parts, int64_t cap) {
  int used = 1;
  int64_t current = 0;
  for (int64_t s : sizes) {
    if (s > cap) return false;
    if (current + s > cap) {
      ++used;
      current = 0;
    }
    current += s;
  }
  return used <= parts;
}

// Largest stage of the best contiguous split (DeepSpeed's `parameters`
// partitioning); a lone tensor is assumed divisible, as when only the total
// parameter count is known.
int64_t LargestStage(const std::vector<int64_t>& sizes, int stages) {
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  if (sizes.size() == 1) return (total + stages - 1) / stages;
  int64_t lo = (total + stages - 1) / stages, hi = total;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (FitsIn(sizes, stages, mid)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

absl::Status CheckAtLeast(const char* what, int64_t value, int64_t min) {
  if (value >= min) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " must be >= ", min, ", got ", value));
}

}  // namespace

absl::StatusOr<MemoryEstimate> EstimateMemory(const EstimateInput& input) {
  ZO_RETURN_IF_ERROR(CheckAtLeast("pipeline stages", input.pipeline_stages, 1));
  ZO_RETURN_IF_ERROR(CheckAtLeast("dp ranks", input.dp_ranks, 1));
  ZO_RETURN_IF_ERROR(CheckAtLeast("servers", input.servers, 1));
  ZO_RETURN_IF_ERROR(CheckAtLeast("micro-batches", input.micro_batches, 1));
  ZO_RETURN_IF_ERROR(CheckAtLeast("chunk_elems", input.chunk_elems, 1));
  ZO_RETURN_IF_ERROR(CheckAtLeast("sub_group_size", input.sub_group_size, 1));
  if (input.nvme) ZO_RETURN_IF_ERROR(CheckAtLeast("buffer_count", input.buffer_count, 3));
  if (input.nvme && input.buffer_count > kMaxBufferCount) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer_count must be <= ", kMaxBufferCount, ", got ", input.buffer_count));
  }
  ZO_RETURN_IF_ERROR(CheckAtLeast("max_live_params", input.max_live_params, 0));
  ZO_RETURN_IF_ERROR(CheckAtLeast("param_nvme_buffer_elems", input.param_nvme_buffer_elems, 0));
  if (input.param_nvme_buffer_elems > 0 && input.max_live_params == 0) {
    return absl::InvalidArgumentError(
        "a buffer for streamed weights on NVMe needs streaming (max_live_params)");
  }
  if (input.precision == DType::kFloat32) {
    return absl::InvalidArgumentError("precision must be fp16 or bf16");
  }
  std::vector<TensorSpec> flat;
  for (size_t i = 0; i < input.tensor_elems.size(); ++i) {
    flat.push_back({absl::StrCat("t", i), {input.tensor_elems[i]}, input.precision});
  }
  ZO_ASSIGN_OR_RETURN(ShardMap map, ShardMap::Create(flat, input.chunk_elems, input.servers));
  if (map.total_elems() < 1) return absl::InvalidArgumentError("the model has no parameters");
  if (map.total_elems() > kMaxParams) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model has ", map.total_elems(), " parameters, more than the 2^48 an estimate covers"));
  }

  MemoryEstimate e;
  e.input = input;
  e.total_params = map.total_elems();
  e.chunk_elems = map.chunk_elems();

  const int64_t lp = static_cast<int64_t>(DTypeSize(input.precision));
  e.gpu.stage_params = LargestStage(input.tensor_elems, input.pipeline_stages);
  e.gpu.param_bytes = e.gpu.stage_params * lp;
  e.gpu.next_param_bytes = e.gpu.stage_params * lp;
  e.gpu.grad_bytes = e.gpu.stage_params * 4;
  e.gpu.compensation_bytes = input.dpu_compensation ? 2 * e.gpu.stage_params * lp : 0;
  e.gpu.total_bytes =
      e.gpu.param_bytes + e.gpu.next_param_bytes + e.gpu.grad_bytes + e.gpu.compensation_bytes;
  e.gpu.host_staging_bytes = 2 * e.gpu.stage_params * lp;
  e.gpu.pushed_bytes_per_step = e.gpu.stage_params * lp;
  GpuEstimate& g = e.gpu_servers;
  g = e.gpu;
  const int64_t largest_tensor = std::min(
      e.gpu.stage_params, *std::max_element(input.tensor_elems.begin(), input.tensor_elems.end()));
  g.grad_bytes = largest_tensor * 4;
  g.compensation_bytes = 0;  // the compensation needs the step's gradients kept: "device" only
  g.total_bytes = g.param_bytes + g.next_param_bytes + g.grad_bytes;
  g.host_staging_bytes = (1 + std::min(input.micro_batches, 2)) * g.stage_params * lp;
  g.pushed_bytes_per_step = g.stage_params * lp * input.micro_batches;
  if (input.max_live_params > 0) {
    GpuEstimate& st = e.gpu_streamed;
    st = g;
    st.param_bytes = std::min(input.max_live_params, st.stage_params) * lp;
    st.next_param_bytes = 0;
    st.total_bytes = st.param_bytes + st.grad_bytes;
    // Gradients leave as the backward makes them, through a ring of a few
    // layers' worth (worker/train/staging_ring.h): 256 MiB, or twice the
    // largest tensor, or the slots' bytes when fewer.
    const int64_t slots_bytes = std::min(input.micro_batches, 2) * st.stage_params * lp;
    const int64_t ring =
        std::min(slots_bytes, std::max(kStreamingGradientRingBytes, 2 * largest_tensor * lp));
    st.host_staging_bytes = st.stage_params * lp + ring;  // the weights' copy and the ring
    if (input.param_nvme_buffer_elems > 0) {
      st.worker_nvme_bytes = st.stage_params * lp;
      // A read slot holds a layer: at least its largest tensor, at most the
      // window.
      const int64_t slot = std::min(largest_tensor, input.max_live_params);
      st.host_staging_bytes +=
          (std::min(input.param_nvme_buffer_elems, st.stage_params) + 2 * slot - st.stage_params) *
          lp;
    }
  }

  ServerEstimate& s = e.server;
  for (int i = 0; i < input.servers; ++i) s.elems = std::max(s.elems, map.ElemsOnServer(i));
  s.master_bytes = s.elems * kMasterBytes;
  s.moment_bytes = s.elems * kMomentBytes;
  // Several dp ranks sum in fp32; one rank's 16-bit gradients are kept as
  // received.
  s.grad_accum_bytes = s.elems * (input.dp_ranks == 1 ? lp : kGradAccumBytes);
  // With the master in RAM a pull rounds it as it reads, and with DPU the
  // version before the latest (pulls of v_t go on while the step writing
  // v_{t+1} runs) is recomputed from the state: the corrections it needs
  // are tens of bytes per million elements, not counted. With the master on
  // NVMe both versions are stored.
  s.low_precision_bytes = s.elems * lp * LowPrecisionCopies(input);
  s.ram_bytes = s.grad_accum_bytes + s.low_precision_bytes;
  if (input.nvme) {
    // Each buffer holds one sub-group's master, m and v; a sub-group never
    // exceeds what the server owns, and a server allocates no more buffers
    // than it has sub-groups.
    s.sub_group_elems = std::min(input.sub_group_size, s.elems);
    const int64_t sub_groups =
        s.sub_group_elems == 0 ? 0 : (s.elems + s.sub_group_elems - 1) / s.sub_group_elems;
    s.io_buffers = std::min<int64_t>(input.buffer_count, sub_groups);
    s.io_buffer_bytes = s.io_buffers * s.sub_group_elems * (kMasterBytes + kMomentBytes);
    s.ram_bytes += s.io_buffer_bytes;
    s.nvme_bytes = s.master_bytes + s.moment_bytes;
  } else {
    s.ram_bytes += s.master_bytes + s.moment_bytes;
    if (input.speculative_update && !input.dpu) {
      s.speculation_bytes = s.master_bytes + s.moment_bytes;
      s.ram_bytes += s.speculation_bytes;
    }
  }
  // One push per element and step (one rank, one micro-batch) is still
  // kept as received.
  e.server_ram_bytes_servers =
      s.ram_bytes - s.grad_accum_bytes +
      s.elems * (input.dp_ranks * input.micro_batches == 1 ? lp : kGradAccumBytes);
  return e;
}

namespace {

// Two columns, and a third when `third` is not empty.
std::string Row(const std::string& what, const std::string& first, const std::string& second = "",
                const std::string& third = "") {
  return absl::StrFormat("  %-38s %12s %12s%s\n", what, first, second,
                         third.empty() ? "" : absl::StrFormat(" %12s", third));
}

}  // namespace

std::string FormatEstimateTable(const MemoryEstimate& e) {
  const EstimateInput& in = e.input;
  const std::string lp(DTypeName(in.precision));
  const ServerEstimate& s = e.server;
  std::string out = absl::StrFormat(
      "zo memory estimate\n"
      "  model    %s parameters in %d tensor(s), %s\n"
      "  workers  %d pipeline stage(s) x %d dp rank(s) = %d GPU(s)\n"
      "  servers  %d, chunks of %s elements, optimizer state in %s\n\n",
      FormatCount(static_cast<double>(e.total_params)), static_cast<int>(in.tensor_elems.size()),
      lp, in.pipeline_stages, in.dp_ranks, in.pipeline_stages * in.dp_ranks, in.servers,
      FormatCount(static_cast<double>(e.chunk_elems)), in.nvme ? "NVMe" : "RAM");

  auto bytes = [](int64_t b) { return FormatBytes(static_cast<double>(b)); };
  const GpuEstimate& d = e.gpu;
  const GpuEstimate& g = e.gpu_servers;
  const bool streams = in.max_live_params > 0;
  const GpuEstimate& st = e.gpu_streamed;
  // A third column, "streamed", when the weights stream.
  auto gpu_row = [&](const std::string& what, int64_t GpuEstimate::*field) {
    return Row(what, bytes(d.*field), bytes(g.*field), streams ? bytes(st.*field) : "");
  };
  absl::StrAppendFormat(
      &out, "per GPU (largest stage: %s parameters), by zo.gradient_accumulation%s\n",
      FormatCount(static_cast<double>(d.stage_params)),
      streams ? absl::StrFormat(", and streamed (%s parameters live)",
                                FormatCount(static_cast<double>(in.max_live_params)))
              : "");
  out += Row("", "device", "servers", streams ? "streamed" : "");
  out += gpu_row(lp + " parameters", &GpuEstimate::param_bytes);
  out += gpu_row(lp + " next step's parameters (prefetch)", &GpuEstimate::next_param_bytes);
  out += gpu_row("fp32 gradients (servers: max tensor)", &GpuEstimate::grad_bytes);
  if (in.dpu_compensation) {
    out += gpu_row(lp + " last two versions (compensation)", &GpuEstimate::compensation_bytes);
  }
  out += gpu_row("total, before activations", &GpuEstimate::total_bytes);
  out += gpu_row("page-locked host staging", &GpuEstimate::host_staging_bytes);
  if (streams && in.param_nvme_buffer_elems > 0) {
    out += gpu_row("worker NVMe (streamed weights)", &GpuEstimate::worker_nvme_bytes);
  }
  out += gpu_row(absl::StrFormat("pushed per step (%d micro-batches)", in.micro_batches),
                 &GpuEstimate::pushed_bytes_per_step);

  absl::StrAppendFormat(&out, "\nper server (largest share: %s elements)\n",
                        FormatCount(static_cast<double>(s.elems)));
  out += Row("", "RAM", "NVMe");
  const bool nvme = in.nvme;
  out += Row("fp32 master weights", nvme ? "-" : bytes(s.master_bytes),
             nvme ? bytes(s.master_bytes) : "-");
  out += Row("fp32 Adam moments (m, v)", nvme ? "-" : bytes(s.moment_bytes),
             nvme ? bytes(s.moment_bytes) : "-");
  out += Row(e.input.dp_ranks == 1 ? lp + " gradients as received" : "fp32 gradient sum",
             bytes(s.grad_accum_bytes), "-");
  const int copies = LowPrecisionCopies(in);
  if (copies == 0 && in.dpu) {
    out += Row(absl::StrCat(lp, " prior version (DPU): recomputed"), "~0", "-");
  }
  if (copies > 0) {
    out += Row(
        absl::StrCat(lp, " copies for pulls (", copies, copies == 1 ? " version)" : " versions)"),
        bytes(s.low_precision_bytes), "-");
  }
  if (s.speculation_bytes > 0) {
    out += Row("speculative update (state's 2nd copy)", bytes(s.speculation_bytes), "-");
  }
  if (nvme) {
    out += Row(absl::StrFormat("swap buffers (%d x %s elements)", s.io_buffers,
                               FormatCount(static_cast<double>(s.sub_group_elems))),
               bytes(s.io_buffer_bytes), "-");
  }
  out += Row("total", bytes(s.ram_bytes), bytes(s.nvme_bytes));
  if (e.server_ram_bytes_servers != s.ram_bytes) {
    out += Row("total, gradient_accumulation servers", bytes(e.server_ram_bytes_servers),
               bytes(s.nvme_bytes));
  }
  out +=
      "\nzo-train's \"auto\" picks device when its total takes at most half the GPU's free\n"
      "memory, else servers (fp32 gradient sum on the servers).\n";
  if (s.speculation_bytes > 0) {
    out +=
        "\nThe speculative update (zo.speculative_update) is optional memory: a server that "
        "cannot\ntake its copy updates without it and says so (--speculative-update=false "
        "leaves it out).\n";
  }
  out += "\nActivations, GPU workspace and gRPC buffers are not included.\n";
  out +=
      "Under servers a layer's fp32 gradients live at once; counted here as the largest\n"
      "tensor's, a lower bound (a transformer block's are about 3x its largest tensor).\n";
  if (streams) {
    out +=
        "Streamed: the window holds whole layers; zo-train --device-memory-budget plans it\n"
        "from a dry step of the schedule, activations included, and prints the plan. Its\n"
        "host staging counts a host copy of the weights; with the servers on the worker's\n"
        "host (or in its process) it keeps two layers' worth instead.\n";
  }
  return out;
}

namespace {

nlohmann::json GpuJson(const GpuEstimate& g) {
  return {{"stage_params", g.stage_params},
          {"param_bytes", g.param_bytes},
          {"next_param_bytes", g.next_param_bytes},
          {"compensation_bytes", g.compensation_bytes},
          {"grad_bytes", g.grad_bytes},
          {"total_bytes", g.total_bytes},
          {"host_staging_bytes", g.host_staging_bytes},
          {"pushed_bytes_per_step", g.pushed_bytes_per_step},
          {"worker_nvme_bytes", g.worker_nvme_bytes}};
}

}  // namespace

std::string FormatEstimateJson(const MemoryEstimate& e) {
  const EstimateInput& in = e.input;
  const ServerEstimate& s = e.server;
  nlohmann::json j = {
      {"parameters", e.total_params},
      {"tensors", in.tensor_elems.size()},
      {"precision", std::string(DTypeName(in.precision))},
      {"pipeline_stages", in.pipeline_stages},
      {"dp_ranks", in.dp_ranks},
      {"gpus", in.pipeline_stages * in.dp_ranks},
      {"servers", in.servers},
      {"chunk_elems", e.chunk_elems},
      {"optimizer_device", in.nvme ? "nvme" : "cpu"},
      {"micro_batches", in.micro_batches},
      {"gpu", GpuJson(e.gpu)},
      {"gpu_gradient_accumulation_servers", GpuJson(e.gpu_servers)},
      {"max_live_params", in.max_live_params},
      {"param_nvme_buffer_elems", in.param_nvme_buffer_elems},
      {"server",
       {{"elems", s.elems},
        {"master_bytes", s.master_bytes},
        {"moment_bytes", s.moment_bytes},
        {"grad_accum_bytes", s.grad_accum_bytes},
        {"low_precision_bytes", s.low_precision_bytes},
        {"speculation_bytes", s.speculation_bytes},
        {"io_buffers", s.io_buffers},
        {"io_buffer_bytes", s.io_buffer_bytes},
        {"sub_group_elems", s.sub_group_elems},
        {"ram_bytes", s.ram_bytes},
        {"ram_bytes_gradient_accumulation_servers", e.server_ram_bytes_servers},
        {"nvme_bytes", s.nvme_bytes}}},
  };
  if (in.max_live_params > 0) j["gpu_streamed"] = GpuJson(e.gpu_streamed);
  return j.dump(2) + "\n";
}

}  // namespace zo
