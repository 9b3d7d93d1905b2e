// `zo-bench gpu`: the GPU worker's compute against the device's own limits,
// measured in the same run.
//
//   gpu_gemm  a large GEMM through the backend (cuBLASLt): the attainable
//             tensor-core peak, TFLOP/s; and the share of the step's time its
//             GEMMs take (each of the step's GEMM shapes timed alone).
//   gpu_step  forward + backward of a GPT-2-small-shaped model (12 layers,
//             768 wide, 12 heads, block 1024, vocabulary 50304) on one GPU:
//             tokens/s, model FLOP/s (6 N + 12 L C T per token, PaLM's
//             count) and MFU = model FLOP/s / the gpu_gemm peak. Compute
//             only: the weights stay on the device and gradients are not
//             pushed (the trainer's figures with servers are zo-train's).
//             Then each other op of the step alone at the step's shapes
//             (attention, layer norm, GELU, residual adds, cross-entropy):
//             where the time that is not GEMM goes.
//
// The step's first loss is printed with the seed and the token formula, so a
// PyTorch twin fed the same weights and tokens can check it
// (bench/torch_twin/gpt2_gpu_step.py).
#ifndef ZO_BENCH_GPU_BENCH_H_
#define ZO_BENCH_GPU_BENCH_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace zo::bench {

struct GpuBenchOptions {
  int device = 0;
  DType dtype = DType::kBFloat16;  // weights and activations of the step; the GEMM's operands
  int64_t gemm_size = 8192;        // the peak GEMM is size x size x size
  int n_layer = 12;
  int n_embd = 768;
  int n_head = 12;
  int block_size = 1024;
  int vocab = 50304;
  int batch = 16;  // sequences per micro-batch
  int micro_batches = 1;
  int warmup_steps = 2;
  int steps = 5;  // timed
  uint64_t seed = 1337;
  bool json = false;

  // Which rows: gpu_gemm and gpu_step always go together (the step's MFU
  // needs the peak); gpu_dpu and gpu_sync need gpu_step's compute time.
  bool step_rows = true;
  bool dpu = true;
  bool sync = true;
  bool largest = false;
  // gpu_largest's GPT (the default: 4.1B parameters) and run.
  int largest_layers = 36;
  int largest_width = 3072;
  int largest_heads = 24;
  int largest_block = 1024;
  int largest_batch = 4;  // sequences per step
  int largest_steps = 20;
  // Adam's first step moves every weight by lr in the sign of its
  // gradient, and 36 layers 3072 wide add those moves up coherently: on an
  // H200 the loss went from 4.04 to 7.0 after one step at lr 1e-6 and to
  // 16-19 at 1e-5..1e-4 (the CPU backend does the same at 151M
  // parameters). What keeps the first steps under one logit of change at
  // this size is about 1e-7.
  double largest_lr = 1e-7;
  int largest_warmup_steps = 0;
  std::string largest_gradient_accumulation = "auto";  // zo.gradient_accumulation
  std::string largest_device = "cuda";  // zo-train's --device; "cpu" for the harness's test
  // ZeRO-Infinity's shape: > 0 streams the weights through a window planned
  // for this many bytes of device memory (zo-train --device-memory-budget);
  // a directory puts the optimizer state on NVMe there.
  int64_t largest_device_memory_budget = 0;
  std::string largest_nvme_dir;
};

absl::Status ValidateGpuBenchOptions(const GpuBenchOptions& options);

// The token at position `i` of micro-batch `micro_batch` of `step` (targets
// use i + 1): a fixed hash, so other programs can feed the same batches.
int32_t GpuBenchToken(int64_t step, int micro_batch, int64_t i, int vocab);

// FAILED_PRECONDITION without a CUDA device.
absl::Status RunGpuBench(const GpuBenchOptions& options, std::ostream& out);

}  // namespace zo::bench

#endif  // ZO_BENCH_GPU_BENCH_H_
