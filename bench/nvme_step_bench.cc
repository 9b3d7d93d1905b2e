#include "bench/nvme_step_bench.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "offload/aligned_buffer.h"
#include "offload/cpu_optimizer.h"
#include "offload/optimizer_kernels.h"
#include "offload/thread_pool.h"
#include "offload/tier/tiered_state.h"

namespace zo::bench {
namespace {

using bench_internal::SecondsSince;
using bench_internal::Summarize;

// Deterministic values in [-1, 1) from an index (SplitMix64 finalizer).
float Noise(uint64_t i) {
  uint64_t z = i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<int64_t>(z >> 40) - (int64_t{1} << 23)) * 0x1p-23f;
}

// The compute-alone baseline: p, m, v of `n` elements in RAM, cut like the
// state into sub-group-sized chunks, sharing the step's gradient and copy.
struct RamState {
  AlignedBuffer memory;
  std::unique_ptr<CpuOptimizer> opt;
};

absl::StatusOr<RamState> MakeRamState(ThreadPool* pool, size_t n, size_t chunk_elems, float* grad,
                                      uint16_t* copy) {
  RamState s;
  ZO_ASSIGN_OR_RETURN(s.memory, AlignedBuffer::Allocate(3 * n * sizeof(float)));
  float* p = s.memory.as<float>();
  std::vector<OptimizerChunk> chunks;
  for (size_t begin = 0; begin < n; begin += chunk_elems) {
    OptimizerChunk c;
    c.n = std::min(chunk_elems, n - begin);
    c.p = p + begin;
    c.m = p + n + begin;
    c.v = p + 2 * n + begin;
    c.grad = {grad + begin, DType::kFloat32};
    c.low_precision = {copy + begin, DType::kFloat16};
    chunks.push_back(c);
  }
  s.opt = std::make_unique<CpuOptimizer>(pool, std::move(chunks));
  return s;
}

}  // namespace

absl::StatusOr<NvmeStepResult> MeasureNvmeStep(const NvmeBenchOptions& o,
                                               const std::string& swap_dir) {
  const size_t n = static_cast<size_t>(o.params);
  ThreadPool pool(o.threads);
  NvmeStepResult result;
  result.threads = pool.size();

  TieredStateOptions so;
  so.swap_dir = swap_dir;
  so.sub_group_elems = o.sub_group_elems;
  so.ram_budget_bytes = 0;  // every sub-group on NVMe
  so.buffer_count = o.buffer_count;
  so.checksums = o.checksums;
  so.io.kind = o.engine;
  so.io.block_size = o.bs;
  so.io.queue_depth = o.qd;
  std::cerr << "nvme: step: creating " << FormatBytes(12.0 * static_cast<double>(n))
            << " of NVMe-resident state under " << swap_dir << "\n";
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<TieredOptimizerState> state,
                      TieredOptimizerState::Create(so, o.params, &pool));
  result.sub_groups = state->num_sub_groups();
  result.io_engine = std::string(state->io_engine_name());
  if (state->nvme_sub_groups() != state->num_sub_groups()) {
    return absl::InternalError(absl::StrCat("asked for all state on NVMe, got ",
                                            state->nvme_sub_groups(), " of ",
                                            state->num_sub_groups(), " sub-groups there"));
  }

  // Gradients ~U(-1e-2, 1e-2) in fp32 (the server's accumulator), the fp16
  // copy written by every step; shared by the NVMe step and the RAM baseline.
  ZO_ASSIGN_OR_RETURN(AlignedBuffer grad_memory, AlignedBuffer::Allocate(n * sizeof(float)));
  ZO_ASSIGN_OR_RETURN(AlignedBuffer copy_memory, AlignedBuffer::Allocate(n * sizeof(uint16_t)));
  float* grad = grad_memory.as<float>();
  uint16_t* copy = copy_memory.as<uint16_t>();
  ZO_ASSIGN_OR_RETURN(RamState ram,
                      MakeRamState(&pool, n, static_cast<size_t>(o.sub_group_elems), grad, copy));
  ram.opt->FirstTouchZero();  // also zeroes grad and copy: fill them after
  ram.opt->ForEachSegment([&](const OptimizerChunk& c, size_t begin, size_t end) {
    const size_t base = static_cast<size_t>(c.p - ram.memory.as<float>());
    for (size_t i = begin; i < end; ++i) {
      c.p[i] = Noise(2 * (base + i));
      grad[base + i] = 1e-2f * Noise(2 * (base + i) + 1);
    }
  });
  std::cerr << "nvme: step: loading master weights into " << result.sub_groups << " sub-groups\n";
  for (size_t begin = 0; begin < n; begin += static_cast<size_t>(o.sub_group_elems)) {
    const size_t len = std::min(static_cast<size_t>(o.sub_group_elems), n - begin);
    ZO_RETURN_IF_ERROR(state->LoadMaster(
        static_cast<int64_t>(begin), absl::Span<const float>(ram.memory.as<float>() + begin, len)));
  }

  AdamHyperParams hp;
  hp.weight_decay = 0.01;
  int64_t nvme_step = 0, ram_step = 0;
  const TypedConstPtr grad_ptr{grad, DType::kFloat32};
  const TypedPtr copy_ptr{copy, DType::kFloat16};
  using Timed = std::function<absl::StatusOr<double>()>;
  const Timed timed[3] = {
      [&]() -> absl::StatusOr<double> {
        const auto start = std::chrono::steady_clock::now();
        ZO_RETURN_IF_ERROR(
            state->AdamStep(MakeAdamStepConstants(hp, ++nvme_step, 1.0), grad_ptr, copy_ptr));
        return SecondsSince(start);
      },
      [&]() -> absl::StatusOr<double> {
        const auto start = std::chrono::steady_clock::now();
        ZO_RETURN_IF_ERROR(state->IoOnlyPass());
        return SecondsSince(start);
      },
      [&]() -> absl::StatusOr<double> {
        const auto start = std::chrono::steady_clock::now();
        ram.opt->AdamStep(MakeAdamStepConstants(hp, ++ram_step, 1.0));
        return SecondsSince(start);
      },
  };
  const char* const names[3] = {"step", "io", "compute"};
  std::cerr << "nvme: step: warm-up\n";
  for (const Timed& t : timed) ZO_RETURN_IF_ERROR(t().status());

  std::vector<double> seconds[3], ratios;
  for (int r = 0; r < o.rounds; ++r) {
    // Rotate the order so that none always follows the same one.
    double s[3];
    for (int k = 0; k < 3; ++k) {
      const int which = (r + k) % 3;
      ZO_ASSIGN_OR_RETURN(s[which], timed[which]());
    }
    for (int k = 0; k < 3; ++k) seconds[k].push_back(s[k]);
    ratios.push_back(s[0] / std::max(s[1], s[2]));
    std::cerr << absl::StrFormat(
        "nvme: step round %d/%d (%s first): step %.3f s, io %.3f s, "
        "compute %.3f s, ratio %.3f\n",
        r + 1, o.rounds, names[r % 3], s[0], s[1], s[2], ratios.back());
  }
  ZO_RETURN_IF_ERROR(state->health());
  result.step_s = Summarize(seconds[0]);
  result.io_s = Summarize(seconds[1]);
  result.compute_s = Summarize(seconds[2]);
  result.ratio = Summarize(ratios);
  return result;
}

}  // namespace zo::bench
