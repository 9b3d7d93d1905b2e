// The rows of `zo-bench gpu` that bring in the servers (bench/gpu_bench.h):
//
//   gpu_dpu      the benchmark GPT trained against an embedded server with
//                DPU (its data on the in-process route): steady step time ÷
//                the GPU's compute alone (target <= 1.3), and ÷ max(that,
//                the server tier's step alone).
//   gpu_sync     the same without DPU.
//   gpu_largest  the biggest GPT this box trains (zo-train's own loop,
//                embedded server, text data): parameters, peak GPU memory,
//                peak host memory, step time, and the loss over the steps.
#ifndef ZO_BENCH_INTERNAL_GPU_OFFLOAD_ROWS_H_
#define ZO_BENCH_INTERNAL_GPU_OFFLOAD_ROWS_H_

#include "absl/status/statusor.h"
#include "bench/gpu_bench.h"
#include "nlohmann/json.hpp"
#include "worker/backend/backend.h"

namespace zo::bench_internal {

// `compute_alone_s`: the gpu_step row's median step (the same model and
// batch, weights on the device, no servers).
// `dpu`: row gpu_dpu, else gpu_sync.
absl::StatusOr<nlohmann::json> MeasureGpuOffloaded(const bench::GpuBenchOptions& options,
                                                   backend::Backend& backend,
                                                   double compute_alone_s, bool dpu);

absl::StatusOr<nlohmann::json> MeasureGpuLargest(const bench::GpuBenchOptions& options);

}  // namespace zo::bench_internal

#endif  // ZO_BENCH_INTERNAL_GPU_OFFLOAD_ROWS_H_
