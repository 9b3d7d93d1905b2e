// The step part of `zo-bench nvme`: one pipelined Adam step over optimizer
// state that lives entirely on NVMe (offload/tier/tiered_state.h), against
// the I/O alone (the same pipeline without updates, IoOnlyPass) and the
// compute alone (the same fused kernel over the same number of elements in
// RAM, CpuOptimizer in sub-group-sized chunks on the same threads).
#ifndef ZO_BENCH_NVME_STEP_BENCH_H_
#define ZO_BENCH_NVME_STEP_BENCH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "bench/internal/bench_stats.h"
#include "bench/nvme_bench.h"

namespace zo::bench {

struct NvmeStepResult {
  int64_t sub_groups = 0;  // all on NVMe
  int threads = 0;
  std::string io_engine;              // what the state's engine turned out to be
  bench_internal::Summary step_s;     // the NVMe-resident step
  bench_internal::Summary io_s;       // IoOnlyPass
  bench_internal::Summary compute_s;  // RAM-resident kernel
  // Per round step / max(io, compute); median and range.
  bench_internal::Summary ratio;
};

// Creates the state under `swap_dir` (which must not exist yet; the caller
// removes it afterwards), loads it, and runs options.rounds rounds of the
// three measurements after one warm-up of each, rotating their order.
absl::StatusOr<NvmeStepResult> MeasureNvmeStep(const NvmeBenchOptions& options,
                                               const std::string& swap_dir);

}  // namespace zo::bench

#endif  // ZO_BENCH_NVME_STEP_BENCH_H_
