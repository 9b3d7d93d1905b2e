// zo-bench: reproducible system benchmarks, each printing a roofline ratio
// measured in the same run (DESIGN.md, "Performance"). Workloads:
//
//   adam   RAM-resident fused CPU Adam step vs. a STREAM-style kernel with
//          the same memory traffic, per SIMD path and thread count
//
// Usage: zo-bench [flags] <workload>...
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/adam_bench.h"
#include "common/command_line.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "common/units.h"

ABSL_FLAG(std::string, params, "256Mi",
          "adam: parameter count; 256Mi = 268435456, also 64M (decimal), 1e8, 1000000");
ABSL_FLAG(std::string, grad_dtype, "fp16",
          "adam: gradient dtype the step reads: fp16, bf16 or fp32 (the copy written is bf16 "
          "for bf16 gradients, fp16 otherwise)");
ABSL_FLAG(std::string, threads, "",
          "adam: comma-separated thread counts, e.g. 1,2,8 (default: every count from 1 to "
          "the number of cores)");
ABSL_FLAG(int, rounds, 7,
          "adam: timed rounds per (path, threads), after one warm-up; each round runs the "
          "step and the baseline once, alternating which goes first");
ABSL_FLAG(std::string, chunk_elems, "4Mi",
          "adam: elements per chunk the parameters are cut into, as on a server");
ABSL_FLAG(bool, json, false, "print one JSON object per result line instead of a table");

namespace zo {
namespace {

constexpr char kUsage[] =
    "zo benchmarks; each prints a ratio against a baseline measured in the same run.\n\n"
    "usage: zo-bench [flags] <workload>...\n\n"
    "workloads:\n"
    "  adam   fused CPU Adam step over --params elements (p, m, v fp32 + a gradient and a\n"
    "         16-bit copy, in chunks of --chunk-elems), for each SIMD path the CPU has\n"
    "         (scalar, avx2, avx512) and each thread count, vs. a STREAM-style loop\n"
    "         moving the same bytes; ratio = median over rounds of the two speeds.\n"
    "         Results on stdout (table or --json lines), progress on stderr.\n"
    "         ZO_SIMD=scalar|avx2|avx512 changes which path counts as dispatched.\n\n"
    "Flags may be written with dashes or underscores.";

// ParseCount plus binary suffixes Ki, Mi, Gi (chunk sizes are powers of two).
absl::StatusOr<int64_t> ParseElems(const std::string& text) {
  static constexpr struct {
    const char* suffix;
    int shift;
  } kBinary[] = {{"Ki", 10}, {"Mi", 20}, {"Gi", 30}};
  for (const auto& b : kBinary) {
    if (text.size() > 2 && text.compare(text.size() - 2, 2, b.suffix) == 0) {
      int64_t n = 0;
      if (!absl::SimpleAtoi(text.substr(0, text.size() - 2), &n) || n <= 0 || n > (1 << 30)) {
        return absl::InvalidArgumentError("not a count: '" + text + "'");
      }
      return n << b.shift;
    }
  }
  return ParseCount(text);
}

absl::StatusOr<bench::AdamBenchOptions> AdamOptionsFromFlags() {
  bench::AdamBenchOptions o;
  ZO_ASSIGN_OR_RETURN(o.params, ParseElems(absl::GetFlag(FLAGS_params)));
  ZO_ASSIGN_OR_RETURN(int64_t chunk, ParseElems(absl::GetFlag(FLAGS_chunk_elems)));
  o.chunk_elems = static_cast<size_t>(chunk);
  const std::string dtype = absl::GetFlag(FLAGS_grad_dtype);
  const std::optional<DType> parsed = ParseDType(dtype);
  if (!parsed) {
    return absl::InvalidArgumentError("--grad-dtype must be fp16, bf16 or fp32, got '" + dtype +
                                      "'");
  }
  o.grad_dtype = *parsed;
  const std::string threads = absl::GetFlag(FLAGS_threads);
  if (!threads.empty()) {
    for (const std::string& t : std::vector<std::string>(absl::StrSplit(threads, ','))) {
      int n = 0;
      if (!absl::SimpleAtoi(t, &n) || n < 1) {
        return absl::InvalidArgumentError("--threads wants counts >= 1 like 1,2,4, got '" +
                                          threads + "'");
      }
      o.threads.push_back(n);
    }
  }
  o.rounds = absl::GetFlag(FLAGS_rounds);
  o.json = absl::GetFlag(FLAGS_json);
  return o;
}

int RunAdam() {
  absl::StatusOr<bench::AdamBenchOptions> options = AdamOptionsFromFlags();
  absl::Status status = options.ok() ? bench::RunAdamBench(*options, std::cout) : options.status();
  if (!status.ok()) {
    std::cerr << "zo-bench adam: " << status.message() << "\n";
    return 2;
  }
  return 0;
}

// The registry: name -> runner, in the order `zo-bench --help` lists them.
struct Workload {
  const char* name;
  int (*run)();
};
constexpr Workload kWorkloads[] = {
    {"adam", RunAdam},
};

int Main(int argc, char** argv) {
  SetUsage(kUsage, "bench/zo_bench_main");
  std::vector<std::string> storage;
  std::vector<char*> args = NormalizeFlagNames(argc, argv, storage);
  std::vector<char*> positional = absl::ParseCommandLine(argc, args.data());
  if (positional.size() < 2) {
    std::cerr << "zo-bench: name a workload; try zo-bench --help\n";
    return 2;
  }
  std::vector<const Workload*> todo;
  for (size_t i = 1; i < positional.size(); ++i) {
    const Workload* found = nullptr;
    for (const Workload& w : kWorkloads) {
      if (std::string(positional[i]) == w.name) found = &w;
    }
    if (found == nullptr) {
      std::cerr << "zo-bench: unknown workload '" << positional[i] << "'; try zo-bench --help\n";
      return 2;
    }
    todo.push_back(found);
  }
  for (const Workload* w : todo) {
    if (int rc = w->run(); rc != 0) return rc;
  }
  return 0;
}

}  // namespace
}  // namespace zo

int main(int argc, char** argv) { return zo::Main(argc, argv); }
