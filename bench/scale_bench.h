// `zo-bench scale`: how the server tier scales with its hosts when links,
// not cores, bound it. Hosts are network namespaces on one machine
// (tests/cluster/netns_hosts.h): one worker host with an uncapped link and
// up to 4 server hosts whose links are each capped at `link_mbit` both ways
// (tc tbf). For each server count k the same job (`params` fp16 elements,
// striped in chunks over the k zo-servers) runs steps of: push every
// gradient, wait for every server's acknowledgement, pull the new fp16
// weights (with `dpu`, the weights of the step before). With k links the
// step should take T(1)/k; efficiency is T(1) / (k T(k))
// (docs/architecture.md target: >= 0.9 at 4). The hosts share this
// machine's cores, so the servers' update does not get faster with k here
// as it would on k real hosts: without DPU it caps the efficiency.
//
// The worker side is a child process forked before this process starts any
// thread; it enters the worker host's namespace (setns) and drives
// OffloadClient there. Needs root (network namespaces, tc).
#ifndef ZO_BENCH_SCALE_BENCH_H_
#define ZO_BENCH_SCALE_BENCH_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/config.h"

namespace zo::bench {

struct ScaleBenchOptions {
  std::vector<int> servers = {1, 2, 4};  // server host counts, the first is the baseline
  int64_t link_mbit = 1000;              // cap of each server host's link, each way; 0: none
  // zo.connections_per_server counts to time each server count with; the
  // efficiency of each is against its own first server count.
  std::vector<int> connections = {ZoConfig::kDefaultConnectionsPerServer};
  int64_t params = int64_t{32} << 20;  // fp16 elements pushed and pulled per step
  int64_t chunk_elems = int64_t{1} << 20;
  // Steps as a worker with the delayed parameter update takes them: after
  // pushing step t it pulls v(t-1), which the servers computed while step
  // t's gradients arrived, so their update leaves the step. Without it the
  // pull waits for v(t), and the update is in every step.
  bool dpu = false;
  int rounds = 3;             // timed steps per server count, after one warm-up step
  std::string server_binary;  // zo-server; empty: the one beside this program
  bool json = false;
};

absl::Status ValidateScaleBenchOptions(const ScaleBenchOptions& options);

// Runs the bench, one row per server count and connection count to `out`,
// progress to stderr.
// FAILED_PRECONDITION when network namespaces cannot be made here, or when
// this process runs threads of its own (the worker is forked).
absl::Status RunScaleBench(const ScaleBenchOptions& options, std::ostream& out);

}  // namespace zo::bench

#endif  // ZO_BENCH_SCALE_BENCH_H_
