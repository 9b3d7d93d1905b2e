// `zo-bench wire`: gradient push over loopback against a plain TCP stream
// between the same two processes in the same run (docs/architecture.md, "Performance":
// ratio >= 0.8).
//
// The bench forks a child process (before this process starts any thread)
// that runs an OffloadServer on 127.0.0.1 and a plain TCP sink on another
// loopback port. This process is the client: per round it pushes one fp16
// tensor of `bytes` with OffloadClient (Push, then FinishStep, which returns
// once the server has acknowledged every piece) and, alternating which goes
// first, sends the same bytes over one TCP connection in send() calls of
// `piece_bytes` until the sink acknowledges them. The first rounds of each
// are warm-up, not timed: HTTP/2 windows grow over a few transfers, and the
// server's allocator takes as many rounds to hold the bytes a grown window
// lets in at once. Rounds never overlap the
// server's optimizer step: each gRPC round waits for its version before the
// next transfer starts. Each round also counts the minor page faults of both
// processes during each transfer (per MiB moved): the cost of buffers that
// the allocator hands back to the kernel and takes again, which on a VM can
// dominate (try GLIBC_TUNABLES=glibc.malloc.trim_threshold=...:
// glibc.malloc.mmap_threshold=... to see the difference).
#ifndef ZO_BENCH_WIRE_BENCH_H_
#define ZO_BENCH_WIRE_BENCH_H_

#include <cstdint>
#include <ostream>

#include "absl/status/status.h"

namespace zo::bench {

struct WireBenchOptions {
  int64_t bytes = int64_t{256} << 20;           // per round; fp16, so an even count
  int rounds = 5;                               // timed rounds, after the warm-up
  int warmup_rounds = 3;                        // untimed rounds of each before them
  int64_t piece_bytes = int64_t{1} << 20;       // GradientPiece payload; TCP write size
  int64_t in_flight_bytes = int64_t{64} << 20;  // ClientOptions::max_bytes_in_flight
  int64_t chunk_elems = int64_t{4} << 20;       // zo.chunk_elems of the job
  bool json = false;                            // one JSON line instead of a table
};

// INVALID_ARGUMENT naming the flag when `options` cannot work.
absl::Status ValidateWireBenchOptions(const WireBenchOptions& options);

// Runs the bench, results to `out`, progress to stderr. The child process is
// stopped and reaped before this returns, also on failure (and dies with
// this process). FAILED_PRECONDITION when this process already runs more
// than one thread (fork would copy locks held by the others).
absl::Status RunWireBench(const WireBenchOptions& options, std::ostream& out);

}  // namespace zo::bench

#endif  // ZO_BENCH_WIRE_BENCH_H_
