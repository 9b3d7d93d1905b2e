// `zo-bench offload`: one optimizer step as a worker sees it with no compute
// in it (push every gradient, the servers' update, pull every weight), per
// route of the data plane, against the same update alone measured in the
// same run (docs/architecture.md, "Routes"); and with `overlap`, the same
// step around a simulated compute, to show how much of the servers' step
// the worker still waits for.
#ifndef ZO_BENCH_OFFLOAD_BENCH_H_
#define ZO_BENCH_OFFLOAD_BENCH_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/config.h"
#include "common/dtype.h"

namespace zo::bench {

struct OffloadBenchOptions {
  int64_t params = int64_t{64} << 20;
  DType dtype = DType::kBFloat16;  // the job's: gradients pushed and weights pulled
  // in_process: the embedded server's in-process route;
  // grpc_in_process: the same server through its in-process gRPC channel;
  // same_host: a server listening on loopback, the data through the
  // shared-memory region and gRPC over TCP carrying the headers, the
  // weights pulled into the region's buffers (RegionPullBuffers);
  // tcp: the same server with everything over gRPC. (The server runs in
  // this process: the bytes take the paths they take between processes.)
  std::vector<std::string> routes = {"in_process", "grpc_in_process", "same_host", "tcp"};
  int threads = 0;  // the server's optimizer threads and the Adam's; 0: one per core
  int rounds = 5;   // timed steps per route, after one warm-up; the Adam alone beside each
  int64_t chunk_elems = int64_t{4} << 20;
  // Gradients pushed per tensor per step, one per micro-batch, summed on
  // the servers (zo.gradient_accumulation "servers"); 1: summed on the
  // worker.
  int micro_batches = 1;
  // zo.connections_per_server: the TCP connections of the tcp route (the
  // same-host route's headers take the first).
  int connections = ZoConfig::kDefaultConnectionsPerServer;
  // Rows `overlap` after each route's step row: the step with a worker's
  // compute in it (a GPU's forward and backward, the CPU idle meanwhile),
  // without and with DPU, against max(compute, the route's step alone).
  bool overlap = false;
  // The worker's compute per step; 0: as long as the route's step without
  // compute (the servers' step alone), where overlap matters most.
  double compute_ms = 0;
  // The overlap rows' worker pulls each tensor on its own and starts each
  // tensor's part of the forward once that tensor's weights are in (a
  // forward needing its first layers first); false: one pull of the whole
  // version, waited for before the forward (as zo-train's worker does).
  bool pull_per_tensor = false;
  bool json = false;
};

absl::Status RunOffloadBench(const OffloadBenchOptions& options, std::ostream& out);

}  // namespace zo::bench

#endif  // ZO_BENCH_OFFLOAD_BENCH_H_
