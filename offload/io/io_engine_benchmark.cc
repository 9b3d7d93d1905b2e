// Sequential throughput of the real engines, a sanity check rather than the
// fio ratio (that is zo-bench's job):
//
//   io_engine_benchmark [--dir=/tmp] [--size_mib=1024] [--block_kib=1024] [--qd=8]
//                       [--engines=io_uring,pread]
//
// Workloads, per engine: write the file sequentially with block-sized
// requests kept qd deep from registered pool buffers, then read it back the
// same way. O_DIRECT, so the page cache is out of the picture.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "offload/io/aligned_buffer_pool.h"
#include "offload/io/direct_file.h"
#include "offload/io/io_engine.h"

namespace zo {
namespace {

struct Flags {
  std::string dir = "/tmp";
  uint64_t size_mib = 1024;
  uint64_t block_kib = 1024;
  int qd = 8;
  std::string engines = "io_uring,pread";
};

// Streams the whole file through `engine`: returns MiB/s.
absl::StatusOr<double> Stream(IoEngine& engine, IoOp op, const DirectFile& file,
                              AlignedBufferPool& pool, uint64_t bytes) {
  const size_t block = pool.buffer_bytes();
  const auto start = std::chrono::steady_clock::now();
  uint64_t next = 0;
  size_t free_index = 0;
  std::vector<int> free_buffers;
  for (size_t i = 0; i < pool.count(); ++i) free_buffers.push_back(static_cast<int>(i));
  while (next < bytes || engine.in_flight() > 0) {
    std::vector<IoRequest> batch;
    while (next < bytes && free_index < free_buffers.size()) {
      const int b = free_buffers[free_index++];
      batch.push_back({op, file.fd(), next, pool.buffer(b), block, static_cast<uint64_t>(b)});
      next += block;
    }
    ZO_RETURN_IF_ERROR(engine.Submit(batch));
    ZO_ASSIGN_OR_RETURN(std::vector<IoCompletion> done, engine.Reap(1));
    for (const IoCompletion& c : done) {
      ZO_RETURN_IF_ERROR(c.status);
      free_buffers[--free_index] = static_cast<int>(c.tag);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(bytes) / (1 << 20) / seconds;
}

absl::Status Run(const Flags& flags) {
  const uint64_t bytes = flags.size_mib << 20;
  const size_t block = flags.block_kib << 10;
  ZO_ASSIGN_OR_RETURN(auto pool, AlignedBufferPool::Create(flags.qd, block));
  for (size_t i = 0; i < pool->count(); ++i) {
    std::memset(pool->buffer(static_cast<int>(i)), static_cast<int>(i) + 1, block);
  }
  for (absl::string_view name : absl::StrSplit(flags.engines, ',')) {
    IoEngineOptions options;
    options.kind = name == "pread" ? IoEngineKind::kPread : IoEngineKind::kIoUring;
    options.block_size = block;
    options.queue_depth = flags.qd;
    ZO_ASSIGN_OR_RETURN(auto engine, CreateIoEngine(options));
    const std::string path = flags.dir + "/zo_io_benchmark.bin";
    ZO_ASSIGN_OR_RETURN(DirectFile file, DirectFile::Open(path, DirectFile::Mode::kCreate));
    ZO_RETURN_IF_ERROR(file.Allocate(bytes));
    ZO_RETURN_IF_ERROR(engine->RegisterFile(file.fd(), file.path()));
    ZO_RETURN_IF_ERROR(engine->RegisterBuffers(*pool));
    ZO_ASSIGN_OR_RETURN(double write_mibs, Stream(*engine, IoOp::kWrite, file, *pool, bytes));
    ZO_ASSIGN_OR_RETURN(double read_mibs, Stream(*engine, IoOp::kRead, file, *pool, bytes));
    std::printf("%-8s %5llu MiB  block %5llu KiB  qd %3d  write %8.1f MiB/s  read %8.1f MiB/s\n",
                std::string(engine->name()).c_str(),
                static_cast<unsigned long long>(flags.size_mib),
                static_cast<unsigned long long>(flags.block_kib), flags.qd, write_mibs, read_mibs);
    ZO_RETURN_IF_ERROR(engine->UnregisterBuffers());
    engine.reset();
    std::remove(path.c_str());
  }
  return absl::OkStatus();
}

bool ParseFlag(absl::string_view arg, Flags& flags) {
  auto value = [&](absl::string_view name) -> std::optional<absl::string_view> {
    const std::string prefix = absl::StrCat("--", name, "=");
    if (!absl::StartsWith(arg, prefix)) return std::nullopt;
    return arg.substr(prefix.size());
  };
  if (auto v = value("dir")) return flags.dir = std::string(*v), true;
  if (auto v = value("engines")) return flags.engines = std::string(*v), true;
  if (auto v = value("size_mib")) return absl::SimpleAtoi(*v, &flags.size_mib);
  if (auto v = value("block_kib")) return absl::SimpleAtoi(*v, &flags.block_kib);
  if (auto v = value("qd")) return absl::SimpleAtoi(*v, &flags.qd);
  return false;
}

}  // namespace
}  // namespace zo

int main(int argc, char** argv) {
  zo::Flags flags;
  for (int i = 1; i < argc; ++i) {
    if (!zo::ParseFlag(argv[i], flags)) {
      std::fprintf(stderr, "unknown or bad flag %s\n", argv[i]);
      return 2;
    }
  }
  const absl::Status status = zo::Run(flags);
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
