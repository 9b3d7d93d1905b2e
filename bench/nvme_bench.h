// `zo-bench nvme`: the NVMe tier against its rooflines, measured in the same
// run on the same file (docs/architecture.md, "Performance"):
//
//   - raw I/O: our engine vs. fio, sequential O_DIRECT read and write of one
//     file with the same block size and queue depth, alternating the two for
//     several rounds (virtual disks vary from run to run); ratio = median of
//     the per-round zo/fio throughput ratios, target >= 0.90;
//   - the pipelined Adam step over NVMe-resident state vs. the I/O alone and
//     the compute alone; ratio = step / max(I/O, compute), target <= 1.2.
//
// Also reports which device and filesystem the file sat on.
#ifndef ZO_BENCH_NVME_BENCH_H_
#define ZO_BENCH_NVME_BENCH_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "offload/io/io_engine.h"

namespace zo::bench {

struct NvmeBenchOptions {
  std::string dir = "/var/tmp";       // where the scratch files go (removed afterwards)
  uint64_t size = uint64_t{1} << 30;  // raw I/O file size, a multiple of bs
  uint64_t bs = uint64_t{1} << 20;    // block size: power of two, >= 4096
  int qd = 8;                         // requests in flight
  int rounds = 5;                     // fio/zo pairs per direction; step rounds
  IoEngineKind engine = IoEngineKind::kAuto;
  std::string fio = "fio";              // the fio binary
  std::string fio_engine = "io_uring";  // fio's --ioengine: io_uring or libaio
  std::vector<std::string> fio_args;    // more fio options, appended
  bool raw = true;                      // run the raw I/O part
  bool step = true;                     // run the step part
  int64_t params = int64_t{64} << 20;   // step: elements of optimizer state
  int64_t sub_group_elems = int64_t{4} << 20;
  int buffer_count = 4;   // step: pipeline buffers (>= 3)
  int threads = 0;        // step: optimizer threads; 0: all cores
  bool checksums = true;  // step: block checksums, as a server runs
  bool json = false;      // one JSON object per line instead of a table
};

// INVALID_ARGUMENT naming the flag when `options` cannot work.
absl::Status ValidateNvmeBenchOptions(const NvmeBenchOptions& options);

// Runs the parts asked for, results to `out`, progress to stderr. Scratch
// files are removed, also on failure. FAILED_PRECONDITION when the directory
// cannot do O_DIRECT or fio cannot be run.
absl::Status RunNvmeBench(const NvmeBenchOptions& options, std::ostream& out);

}  // namespace zo::bench

#endif  // ZO_BENCH_NVME_BENCH_H_
