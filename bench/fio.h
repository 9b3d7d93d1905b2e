// fio (https://github.com/axboe/fio) as the baseline of `zo-bench nvme`: one
// sequential O_DIRECT job on a given file, run as a subprocess, its JSON
// report parsed.
//
//   FioJob job{.filename = "/nvme/x.bin", .rw = "read", .size = 1 << 30};
//   ZO_ASSIGN_OR_RETURN(FioResult r, RunFio(job));
//   // r.bytes_per_s: what fio reports as bw_bytes
#ifndef ZO_BENCH_FIO_H_
#define ZO_BENCH_FIO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace zo::bench {

struct FioJob {
  std::string binary = "fio";  // searched in PATH when it has no slash
  std::string filename;        // must exist at full size for reads
  std::string rw = "read";     // "read" or "write" (sequential)
  uint64_t size = 0;           // bytes
  uint64_t bs = uint64_t{1} << 20;
  int iodepth = 8;
  std::string ioengine = "io_uring";    // or "libaio"
  std::vector<std::string> extra_args;  // appended as given, e.g. "--fixedbufs=1"
};

// One job's numbers for its direction.
struct FioResult {
  uint64_t io_bytes = 0;  // bytes moved
  uint64_t runtime_ms = 0;
  double bytes_per_s = 0;  // fio's bw_bytes
};

// The command line RunFio runs (argv[0] is job.binary): --output-format=json
// --direct=1 --numjobs=1 --rw --bs --iodepth --size --ioengine --filename,
// then job.extra_args; every other option at fio's default.
std::vector<std::string> FioArgs(const FioJob& job);

// Parses fio's --output-format=json report of one job and takes the numbers
// of `rw` ("read" or "write"). Text before the first '{' (fio's warnings) is
// skipped. INVALID_ARGUMENT when it is not such a report; INTERNAL when the
// job reports an error or moved no bytes.
absl::StatusOr<FioResult> ParseFioJson(const std::string& text, const std::string& rw);

// Runs the job (fio's stderr goes to ours, its stdout is the report) and
// parses the report. FAILED_PRECONDITION when fio cannot be started (not
// installed), INTERNAL with fio's output when it fails or moves other than
// job.size bytes.
absl::StatusOr<FioResult> RunFio(const FioJob& job);

// "fio-3.33", from `fio --version`.
absl::StatusOr<std::string> FioVersion(const std::string& binary);

// Sizes as fio reads them (kb_base=1024): "1073741824", "1G", "1g", "1GiB",
// "512Ki", "4k", "4KiB"; K, M, G, T are powers of 1024. "1GB" is refused as
// ambiguous. INVALID_ARGUMENT for anything else, zero or past 2^62.
absl::StatusOr<uint64_t> ParseByteSize(const std::string& text);

}  // namespace zo::bench

#endif  // ZO_BENCH_FIO_H_
