#include "bench/nvme_bench.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/file_location.h"
#include "bench/fio.h"
#include "bench/internal/bench_stats.h"
#include "bench/nvme_step_bench.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "nlohmann/json.hpp"
#include "offload/io/aligned_buffer_pool.h"
#include "offload/io/direct_file.h"
#include "offload/io/io_error.h"

namespace zo::bench {
namespace {

using bench_internal::SecondsSince;
using bench_internal::Summarize;
using bench_internal::Summary;

constexpr double kMB = 1e6;  // throughputs are in decimal MB/s, as fio's bw_bytes / 1e6

// The scratch directory of one run, removed with everything in it when this
// goes out of scope.
class ScratchDir {
 public:
  static absl::StatusOr<ScratchDir> Create(const std::string& parent) {
    std::string path = absl::StrCat(parent, "/zo-bench-nvme-", getpid());
    if (mkdir(path.c_str(), 0700) != 0) return ZO_ERRNO_STATUS(errno, "mkdir " + path);
    return ScratchDir(std::move(path));
  }
  ScratchDir(ScratchDir&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  ScratchDir& operator=(ScratchDir&&) = delete;
  ~ScratchDir() {
    if (path_.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// One sequential pass over the file: bs-sized requests, qd of them in flight,
// one per pool buffer, a finished one replaced at once (fio's pattern with
// its defaults). Returns seconds from the first submission to the last
// completion.
absl::StatusOr<double> ZoPass(IoEngine& engine, IoOp op, int fd, AlignedBufferPool& pool,
                              uint64_t size) {
  const size_t bs = pool.buffer_bytes();
  std::vector<int> free_buffers;
  for (size_t i = pool.count(); i > 0; --i) free_buffers.push_back(static_cast<int>(i - 1));
  std::vector<IoRequest> batch;
  uint64_t next = 0;
  const auto start = std::chrono::steady_clock::now();
  while (next < size || engine.in_flight() > 0) {
    batch.clear();
    while (next < size && !free_buffers.empty()) {
      const int b = free_buffers.back();
      free_buffers.pop_back();
      batch.push_back({op, fd, next, pool.buffer(b), bs, static_cast<uint64_t>(b)});
      next += bs;
    }
    if (!batch.empty()) ZO_RETURN_IF_ERROR(engine.Submit(batch));
    ZO_ASSIGN_OR_RETURN(std::vector<IoCompletion> done, engine.Reap(1));
    for (const IoCompletion& c : done) {
      ZO_RETURN_IF_ERROR(c.status);
      free_buffers.push_back(static_cast<int>(c.tag));
    }
  }
  return SecondsSince(start);
}

struct IoResult {
  IoOp op;
  Summary zo_mb_per_s;
  Summary fio_mb_per_s;
  Summary ratio;  // per round zo / fio
};

struct RawContext {
  std::string engine_name;
  std::string fio_version;
  std::vector<IoResult> results;
};

absl::StatusOr<RawContext> MeasureRawIo(const NvmeBenchOptions& o, const std::string& path,
                                        std::string fio_version) {
  RawContext ctx;
  ctx.fio_version = std::move(fio_version);
  IoEngineOptions io;
  io.kind = o.engine;
  io.block_size = o.bs;
  io.queue_depth = o.qd;
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine, CreateIoEngine(io));
  ctx.engine_name = std::string(engine->name());
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<AlignedBufferPool> pool,
                      AlignedBufferPool::Create(static_cast<size_t>(o.qd), o.bs));
  for (size_t i = 0; i < pool->count(); ++i) {
    std::memset(pool->buffer(static_cast<int>(i)), 0x5a + static_cast<int>(i), o.bs);
  }
  ZO_ASSIGN_OR_RETURN(DirectFile file, DirectFile::Open(path, DirectFile::Mode::kReadWrite));
  ZO_RETURN_IF_ERROR(engine->RegisterFile(file.fd(), file.path()));
  ZO_RETURN_IF_ERROR(engine->RegisterBuffers(*pool));

  // Data on every block first, so reads read the disk and not the holes of
  // unwritten extents; this also warms up the engine.
  std::cerr << "nvme: writing " << FormatBytes(static_cast<double>(o.size)) << " to " << path
            << " (untimed, so that reads are real)\n";
  ZO_RETURN_IF_ERROR(ZoPass(*engine, IoOp::kWrite, file.fd(), *pool, o.size).status());

  FioJob job;
  job.binary = o.fio;
  job.filename = path;
  job.size = o.size;
  job.bs = o.bs;
  job.iodepth = o.qd;
  job.ioengine = o.fio_engine;
  job.extra_args = o.fio_args;
  std::cerr << "nvme: fio command: " << absl::StrJoin(FioArgs(job), " ") << "\n";
  const IoOp ops[] = {IoOp::kRead, IoOp::kWrite};
  std::vector<double> zo_mbps[2], fio_mbps[2], ratios[2];
  for (int r = 0; r < o.rounds; ++r) {
    for (int k = 0; k < 2; ++k) {
      job.rw = IoOpName(ops[k]);
      double zo = 0, fio = 0;
      // Alternate which goes first, so neither always inherits the other's
      // disk state (write-back in the host, burst credits).
      for (int turn = 0; turn < 2; ++turn) {
        if ((turn == 0) == (r % 2 == 0)) {
          ZO_ASSIGN_OR_RETURN(FioResult f, RunFio(job));
          fio = f.bytes_per_s / kMB;
        } else {
          ZO_ASSIGN_OR_RETURN(double s, ZoPass(*engine, ops[k], file.fd(), *pool, o.size));
          zo = static_cast<double>(o.size) / s / kMB;
        }
      }
      zo_mbps[k].push_back(zo);
      fio_mbps[k].push_back(fio);
      ratios[k].push_back(zo / fio);
      std::cerr << absl::StrFormat(
          "nvme: round %d/%d %-5s %s first: zo %.1f MB/s, fio %.1f MB/s, "
          "ratio %.3f\n",
          r + 1, o.rounds, job.rw, r % 2 == 0 ? "fio" : "zo", zo, fio, zo / fio);
    }
  }
  for (int k = 0; k < 2; ++k) {
    ctx.results.push_back(
        {ops[k], Summarize(zo_mbps[k]), Summarize(fio_mbps[k]), Summarize(ratios[k])});
  }
  ZO_RETURN_IF_ERROR(engine->UnregisterBuffers());
  ZO_RETURN_IF_ERROR(engine->UnregisterFile(file.fd()));
  return ctx;
}

void PrintRaw(const NvmeBenchOptions& o, const RawContext& ctx, const FileLocation& where,
              std::ostream& out) {
  if (!o.json) {
    out << absl::StrFormat(
        "\nraw I/O: sequential O_DIRECT read and write of the whole file, bs %d, qd %d, %d rounds "
        "alternating\n  zo (%s engine, registered buffers) and %s (--ioengine=%s%s); MB = 1e6 "
        "bytes\n  ratio = median of per-round zo/fio ratios (target >= 0.90)\n\n"
        "%-6s %-9s %9s %4s %10s %10s %7s   %s\n",
        o.bs, o.qd, o.rounds, ctx.engine_name, ctx.fio_version, o.fio_engine,
        o.fio_args.empty() ? "" : " " + absl::StrJoin(o.fio_args, " "), "op", "engine", "bs", "qd",
        "zo MB/s", "fio MB/s", "ratio", "min..max");
  }
  for (const IoResult& r : ctx.results) {
    if (o.json) {
      nlohmann::json j = {{"bench", "nvme_io"},
                          {"op", IoOpName(r.op)},
                          {"engine", ctx.engine_name},
                          {"bs", o.bs},
                          {"qd", o.qd},
                          {"zo_mb_per_s", r.zo_mb_per_s.median},
                          {"fio_mb_per_s", r.fio_mb_per_s.median},
                          {"ratio", r.ratio.median},
                          {"ratio_min", r.ratio.min},
                          {"ratio_max", r.ratio.max},
                          {"rounds", o.rounds},
                          {"size", o.size},
                          {"fio", ctx.fio_version},
                          {"fio_engine", o.fio_engine},
                          {"fio_args", absl::StrJoin(o.fio_args, " ")},
                          {"device", where.source},
                          {"fs_type", where.fs_type},
                          {"mount_point", where.mount_point}};
      out << j.dump() << std::endl;
    } else {
      out << absl::StrFormat("%-6s %-9s %9d %4d %10.1f %10.1f %7.3f   %.3f..%.3f\n", IoOpName(r.op),
                             ctx.engine_name, o.bs, o.qd, r.zo_mb_per_s.median,
                             r.fio_mb_per_s.median, r.ratio.median, r.ratio.min, r.ratio.max)
          << std::flush;
    }
  }
}

void PrintStep(const NvmeBenchOptions& o, const NvmeStepResult& r, std::ostream& out) {
  if (o.json) {
    nlohmann::json j = {{"bench", "nvme_step"},
                        {"params", o.params},
                        {"step_s", r.step_s.median},
                        {"io_s", r.io_s.median},
                        {"compute_s", r.compute_s.median},
                        {"ratio", r.ratio.median},
                        {"ratio_min", r.ratio.min},
                        {"ratio_max", r.ratio.max},
                        {"rounds", o.rounds},
                        {"sub_group_elems", o.sub_group_elems},
                        {"sub_groups", r.sub_groups},
                        {"buffer_count", o.buffer_count},
                        {"threads", r.threads},
                        {"checksums", o.checksums},
                        {"engine", r.io_engine},
                        {"bs", o.bs},
                        {"qd", o.qd}};
    out << j.dump() << std::endl;
    return;
  }
  const double state_bytes = 12.0 * static_cast<double>(o.params);
  out << absl::StrFormat(
      "\nstep: Adam over %d params (%s of fp32 master, m, v), all on NVMe in %d sub-groups of "
      "%d,\n  %d buffers, %s engine bs %d qd %d, %d threads, checksums %s; fp32 gradients, "
      "fp16 copy\n  io = the same pipeline without updates; compute = the same kernel on the "
      "same threads in RAM\n  ratio = median of per-round step / max(io, compute) (target <= "
      "1.2); times are medians of %d rounds\n\n"
      "%-10s %8s %8s %10s %11s %7s   %s\n",
      o.params, FormatBytes(state_bytes), r.sub_groups, o.sub_group_elems, o.buffer_count,
      r.io_engine, o.bs, o.qd, r.threads, o.checksums ? "on" : "off", o.rounds, "params", "step s",
      "io s", "compute s", "step MB/s", "ratio", "min..max");
  out << absl::StrFormat("%-10d %8.3f %8.3f %10.3f %11.1f %7.3f   %.3f..%.3f\n", o.params,
                         r.step_s.median, r.io_s.median, r.compute_s.median,
                         2 * state_bytes / r.step_s.median / kMB, r.ratio.median, r.ratio.min,
                         r.ratio.max)
      << std::flush;
}

}  // namespace

absl::Status ValidateNvmeBenchOptions(const NvmeBenchOptions& o) {
  if (o.dir.empty()) return absl::InvalidArgumentError("--dir must name a directory");
  if (o.bs < 4096 || (o.bs & (o.bs - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--bs must be a power of two >= 4096 (O_DIRECT), got ", o.bs));
  }
  if (o.size == 0 || o.size % o.bs != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--size must be a positive multiple of --bs (", o.bs, "), got ", o.size));
  }
  if (o.qd < 1 || o.qd > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("--qd must be in 1..4096, got ", o.qd));
  }
  if (o.rounds < 1) return absl::InvalidArgumentError("--rounds must be at least 1");
  if (o.fio_engine != "io_uring" && o.fio_engine != "libaio") {
    return absl::InvalidArgumentError("--fio-engine must be io_uring or libaio, got '" +
                                      o.fio_engine + "'");
  }
  if (o.params <= 0) return absl::InvalidArgumentError("--params must be positive");
  if (o.sub_group_elems <= 0 || o.sub_group_elems % 1024 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--sub-group must be a positive multiple of 1024 elements, got ", o.sub_group_elems));
  }
  if (o.buffer_count < 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--buffer-count must be at least 3 (read, update, write), got ", o.buffer_count));
  }
  if (o.threads < 0) return absl::InvalidArgumentError("--threads must be >= 1");
  if (!o.raw && !o.step) return absl::InvalidArgumentError("nothing to run: --parts is empty");
  return absl::OkStatus();
}

absl::Status RunNvmeBench(const NvmeBenchOptions& o, std::ostream& out) {
  ZO_RETURN_IF_ERROR(ValidateNvmeBenchOptions(o));
  std::string fio_version;
  if (o.raw) {  // fail before any I/O when fio is missing
    ZO_ASSIGN_OR_RETURN(fio_version, FioVersion(o.fio));
  }
  ZO_RETURN_IF_ERROR(CheckDirectIo(o.dir));
  ZO_ASSIGN_OR_RETURN(ScratchDir scratch, ScratchDir::Create(o.dir));
  // Where the files sit: the raw file's device is the step's too (same directory).
  const std::string path = scratch.path() + "/raw.bin";
  ZO_ASSIGN_OR_RETURN(FileLocation where, [&]() -> absl::StatusOr<FileLocation> {
    ZO_ASSIGN_OR_RETURN(DirectFile file, DirectFile::Open(path, DirectFile::Mode::kCreate));
    ZO_RETURN_IF_ERROR(file.Allocate(o.raw ? o.size : 4096));
    return LocateFile(path);
  }());
  std::cerr << "nvme: files under " << scratch.path() << " on " << where.ToString() << "\n";
  if (!o.json) {
    out << "nvme: files under " << scratch.path() << "\n  on " << where.ToString() << "\n"
        << std::flush;
  }
  if (where.fs_type == "tmpfs" || where.fs_type == "ramfs") {
    std::cerr << "nvme: warning: " << o.dir << " is " << where.fs_type
              << ", memory rather than a disk; use --dir on the NVMe device\n";
  }
  if (o.raw) {
    ZO_ASSIGN_OR_RETURN(RawContext ctx, MeasureRawIo(o, path, std::move(fio_version)));
    PrintRaw(o, ctx, where, out);
  }
  std::filesystem::remove(path);
  if (o.step) {
    ZO_ASSIGN_OR_RETURN(NvmeStepResult r, MeasureNvmeStep(o, scratch.path() + "/step"));
    PrintStep(o, r, out);
  }
  return absl::OkStatus();
}

}  // namespace zo::bench
