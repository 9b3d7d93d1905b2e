// `zo-bench adam`: the RAM-resident CPU Adam step against a STREAM-style
// kernel with the same memory traffic, measured in the same run on the same
// arrays with the same threads (docs/architecture.md, "Performance").
#ifndef ZO_BENCH_ADAM_BENCH_H_
#define ZO_BENCH_ADAM_BENCH_H_

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace zo::bench {

struct AdamBenchOptions {
  int64_t params = int64_t{256} << 20;
  DType grad_dtype = DType::kFloat16;
  std::vector<int> threads;  // empty: 1, 2, ..., all cores
  int rounds = 7;            // timed rounds per (path, threads), after one warm-up
  size_t chunk_elems = size_t{4} << 20;
  bool json = false;  // one JSON object per line instead of a table
};

// Runs every supported SIMD path at every thread count, printing results to
// `out` and progress to stderr. INVALID_ARGUMENT for impossible options,
// RESOURCE_EXHAUSTED when the arrays cannot be mapped.
absl::Status RunAdamBench(const AdamBenchOptions& options, std::ostream& out);

}  // namespace zo::bench

#endif  // ZO_BENCH_ADAM_BENCH_H_
