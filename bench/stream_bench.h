// `zo-bench stream`: what streaming a stage's parameters costs its step
// (zero_optimization.offload_param, worker/model/param_window.h). zo-train's
// own loop, with an embedded server, trains a GPT twice from the same seed:
// every weight on the device, then at most `window` of the parameters there
// at once (the rest read from the embedded server's own copy, or from a
// file with nvme_dir),
// alternating `rounds` times; both sum gradients on the servers, as
// streaming needs. The losses must be equal bit for bit; ratio = median
// streamed step / median resident step (issue target on a GPU: <= 1.15).
#ifndef ZO_BENCH_STREAM_BENCH_H_
#define ZO_BENCH_STREAM_BENCH_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace zo::bench {

struct StreamBenchOptions {
  std::string device = "cpu";  // zo-train's --device: cpu, cuda or auto
  DType dtype = DType::kBFloat16;
  int n_layer = 8;
  int n_embd = 256;
  int n_head = 8;
  int block_size = 128;
  int batch = 8;  // sequences per micro-batch
  int micro_batches = 2;
  int steps = 8;  // per run; the second half is timed
  int rounds = 2;
  // The streamed runs' window, as a share of the model's parameters
  // (stage3_max_live_parameters = window x parameters, at least the largest
  // layer).
  double window = 0.25;
  // Non-empty: the streamed runs keep their weights in a file in this
  // directory (offload_param "nvme") instead of host memory.
  std::string nvme_dir;
  uint64_t seed = 1337;
  bool json = false;
};

absl::Status RunStreamBench(const StreamBenchOptions& options, std::ostream& out);

}  // namespace zo::bench

#endif  // ZO_BENCH_STREAM_BENCH_H_
