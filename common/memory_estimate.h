// Memory sizing for a zo deployment, in the spirit of DeepSpeed's estimators
// but for our tiers: bytes per GPU, per server RAM and per server NVMe
// (docs/architecture.md, "Memory tiers").
#ifndef ZO_COMMON_MEMORY_ESTIMATE_H_
#define ZO_COMMON_MEMORY_ESTIMATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace zo {

// A streaming worker's gradients leave through a ring of this many bytes,
// or twice its largest gradient (worker/train/offload_link.h).
inline constexpr int64_t kStreamingGradientRingBytes = int64_t{256} << 20;

struct EstimateInput {
  // Parameter count of each tensor in manifest order; a single entry when
  // only the total is known. Stages are balanced over these contiguously.
  std::vector<int64_t> tensor_elems;
  int pipeline_stages = 1;
  int dp_ranks = 1;  // replicas of each stage, i.e. GPUs per stage
  int servers = 1;
  DType precision = DType::kFloat16;  // fp16 or bf16
  bool nvme = false;                  // optimizer state (master, m, v) on NVMe
  bool dpu = false;                   // zo.dpu: the delayed parameter update
  // zo.dpu.compensation "worker": the GPU keeps the last two versions it
  // pulled beside its weights ("device" policy only).
  bool dpu_compensation = false;
  // zo.speculative_update: a second copy of the optimizer state in RAM where
  // a server speculates (not with NVMe or DPU).
  bool speculative_update = true;
  int64_t chunk_elems = int64_t{4} << 20;
  int64_t sub_group_size = 1000000000;  // DeepSpeed's default
  int buffer_count = 4;
  int micro_batches = 1;  // gradient_accumulation_steps
  // Parameter streaming (zero_optimization.offload_param "cpu"): at most
  // this many parameters of a stage on the device at once; 0: no streaming.
  int64_t max_live_params = 0;
  // With streaming, offload_param "nvme": the streamed weights live in a
  // file on the worker's NVMe, pulled through a buffer of this many
  // parameters (offload_param.buffer_size); 0: they stay in host memory.
  int64_t param_nvme_buffer_elems = 0;
};

// What a GPU worker holds for the largest stage (worker/train/offload_link.h)
// under one zo.gradient_accumulation policy: its 16-bit weights, a second set
// the next step's weights are uploaded into while a step computes, and fp32
// gradients: all of them summing the micro-batches ("device"), or only those
// of the layer the backward is in ("servers"; counted here as the largest
// tensor's, since the input has tensors, not layers: a lower bound, about a
// third of a transformer block's).
struct GpuEstimate {
  int64_t stage_params = 0;  // parameters of the largest stage
  int64_t param_bytes = 0;
  int64_t next_param_bytes = 0;  // the idle copy the prefetch fills
  // zo.dpu.compensation "worker": the last two versions pulled, as pulled.
  int64_t compensation_bytes = 0;
  int64_t grad_bytes = 0;   // fp32
  int64_t total_bytes = 0;  // before activations and workspace
  // Page-locked host memory per worker: pulled weights and pushed
  // gradients, both 16-bit, staged for the copy engines (two gradient slots
  // when micro-batches push one by one).
  int64_t host_staging_bytes = 0;
  int64_t pushed_bytes_per_step = 0;  // gradient bytes one worker sends
  // Streamed weights in a file on the worker's NVMe (offload_param "nvme").
  int64_t worker_nvme_bytes = 0;
};

// For the server holding the most elements.
struct ServerEstimate {
  int64_t elems = 0;
  int64_t master_bytes = 0;      // fp32 master weights
  int64_t moment_bytes = 0;      // fp32 Adam m and v
  int64_t grad_accum_bytes = 0;  // gradient buffer: fp32 sum, or 16-bit with one dp rank (RAM)
  // fp16/bf16 copies served to pulls (RAM): none when pulls round the
  // master (all in RAM; with DPU the previous version is recomputed), two
  // with NVMe (server/param_versions.h)
  int64_t low_precision_bytes = 0;
  // The speculative update's second master, m and v (RAM): where the state
  // is all in RAM, without DPU. A server whose host or memory budget cannot
  // take it does not speculate, and holds this much less.
  int64_t speculation_bytes = 0;
  int64_t io_buffers = 0;       // swap buffers: buffer_count, at most one per sub-group
  int64_t io_buffer_bytes = 0;  // swap buffers, NVMe only
  int64_t sub_group_elems = 0;  // sub-group actually used (clamped to elems)
  int64_t ram_bytes = 0;
  int64_t nvme_bytes = 0;
};

struct MemoryEstimate {
  EstimateInput input;
  int64_t total_params = 0;
  // The chunk size the servers use: input.chunk_elems, capped so that every
  // server holds a share of a small model (ShardMap).
  int64_t chunk_elems = 0;
  GpuEstimate gpu;          // zo.gradient_accumulation "device"
  GpuEstimate gpu_servers;  // "servers"
  // Streaming (input.max_live_params > 0), which sums on the servers: the
  // window of weights on the device, no prefetch set, one layer's fp32
  // gradients (counted as under "servers"); the host staging, a host copy
  // of the weights and a ring for the gradients as they leave (256 MiB, or
  // twice the largest tensor, or the servers policy's slots if fewer). With
  // offload_param "nvme" the weights are in a file instead, and the host
  // keeps the pull's buffer and the window's two read slots (a layer each;
  // counted as the largest tensor or the window if smaller, a lower bound
  // like the gradients).
  GpuEstimate gpu_streamed;
  ServerEstimate server;  // "device"
  // The server's RAM under "servers": its gradient buffer sums in fp32 even
  // with one dp rank (unless there is one micro-batch too).
  int64_t server_ram_bytes_servers = 0;
};

// INVALID_ARGUMENT on counts below 1, no parameters, a precision other than
// fp16/bf16, an NVMe estimate with fewer than 3 buffers, a negative
// max_live_params, or a param_nvme_buffer_elems that is negative or comes
// without streaming.
absl::StatusOr<MemoryEstimate> EstimateMemory(const EstimateInput& input);

// A table for people.
std::string FormatEstimateTable(const MemoryEstimate& estimate);

// One JSON object for scripts; every size in bytes.
std::string FormatEstimateJson(const MemoryEstimate& estimate);

}  // namespace zo

#endif  // ZO_COMMON_MEMORY_ESTIMATE_H_
