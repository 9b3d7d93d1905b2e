#include "offload/io/io_engine.h"

#include <atomic>
#include <bit>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "offload/io/block_io_engine.h"
#include "offload/io/internal/create_backend.h"
#include "offload/io/pread_backend.h"
#include "offload/io/uring_backend.h"

namespace zo {

const char* IoOpName(IoOp op) { return op == IoOp::kRead ? "read" : "write"; }

IoEngineOptions IoEngineOptionsFromConfig(const AioConfig& aio) {
  IoEngineOptions options;
  options.block_size = static_cast<size_t>(aio.block_size);
  options.queue_depth = aio.queue_depth;
  options.single_submit = aio.single_submit;
  return options;
}

absl::Status ValidateIoEngineOptions(const IoEngineOptions& o) {
  auto bad = [](absl::string_view what, auto value, absl::string_view rule) {
    return absl::InvalidArgumentError(
        absl::StrCat("I/O engine option ", what, " = ", value, ": ", rule));
  };
  if (!std::has_single_bit(o.alignment)) return bad("alignment", o.alignment, "not a power of two");
  if (!std::has_single_bit(o.block_size) || o.block_size < o.alignment ||
      o.block_size > (size_t{1} << 30)) {
    return bad("block_size", o.block_size,
               absl::StrCat("not a power of two in [alignment ", o.alignment, ", 1 GiB]"));
  }
  if (o.queue_depth < 1 || o.queue_depth > 4096) {
    return bad("queue_depth", o.queue_depth, "not in [1, 4096]");
  }
  if (o.sqpoll_idle_ms < 0) return bad("sqpoll_idle_ms", o.sqpoll_idle_ms, "negative");
  if (o.max_files < 0 || o.max_files > 65536) {
    return bad("max_files", o.max_files, "not in [0, 65536]");
  }
  if (o.pread_threads < 0 || o.pread_threads > 1024) {
    return bad("pread_threads", o.pread_threads, "not in [0, 1024]");
  }
  return absl::OkStatus();
}

namespace {

std::unique_ptr<IoBackend> PreadFor(const IoEngineOptions& options) {
  return CreatePreadBackend(options.pread_threads > 0 ? options.pread_threads
                                                      : options.queue_depth);
}

}  // namespace

namespace io_internal {

absl::StatusOr<std::unique_ptr<IoBackend>> CreateAutoBackend(const IoEngineOptions& options,
                                                             UringFactory make_uring,
                                                             std::atomic<bool>* fallback_logged) {
  absl::StatusOr<std::unique_ptr<IoBackend>> uring = make_uring(options);
  if (uring.ok()) return uring;
  if (!fallback_logged->exchange(true)) {
    ZO_LOG(WARNING) << "io_uring cannot be used (" << uring.status()
                    << "); NVMe I/O falls back to a pread/pwrite thread pool";
  }
  return PreadFor(options);
}

}  // namespace io_internal

absl::StatusOr<std::unique_ptr<IoBackend>> CreateIoBackend(const IoEngineOptions& options) {
  ZO_RETURN_IF_ERROR(ValidateIoEngineOptions(options));
  switch (options.kind) {
    case IoEngineKind::kIoUring:
      return CreateUringBackend(options);
    case IoEngineKind::kPread:
      return PreadFor(options);
    case IoEngineKind::kAuto:
      break;
  }
  // Once per process: engines are made per job, the reason does not change.
  static std::atomic<bool> fallback_logged{false};
  return io_internal::CreateAutoBackend(options, CreateUringBackend, &fallback_logged);
}

absl::StatusOr<std::unique_ptr<IoEngine>> CreateIoEngine(const IoEngineOptions& options) {
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<IoBackend> backend, CreateIoBackend(options));
  return NewBlockIoEngine(options, std::move(backend));
}

namespace {

absl::Status TransferFully(IoEngine& engine, IoOp op, int fd, uint64_t offset, void* buf,
                           size_t len) {
  if (engine.in_flight() != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(IoOpName(op), "Fully: ", engine.in_flight(),
                     " requests are in flight on the engine; their completions would be lost"));
  }
  const IoRequest request{op, fd, offset, buf, len, /*tag=*/0};
  ZO_RETURN_IF_ERROR(engine.Submit({request}));
  ZO_ASSIGN_OR_RETURN(std::vector<IoCompletion> done, engine.Reap(1));
  return done.front().status;
}

}  // namespace

absl::Status ReadFully(IoEngine& engine, int fd, uint64_t offset, void* buf, size_t len) {
  return TransferFully(engine, IoOp::kRead, fd, offset, buf, len);
}

absl::Status WriteFully(IoEngine& engine, int fd, uint64_t offset, const void* buf, size_t len) {
  // The engine only reads from the buffer of a write.
  return TransferFully(engine, IoOp::kWrite, fd, offset, const_cast<void*>(buf), len);
}

}  // namespace zo
