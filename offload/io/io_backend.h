// The seam below IoEngine: something that moves already-checked pieces
// (at most block_size bytes, aligned) and reports what the kernel would:
// a byte count, possibly short, or -errno. Splitting, the queue depth,
// resubmitting short transfers and wording errors live once, in
// BlockIoEngine (offload/io/block_io_engine.h); the backends are io_uring,
// the pread pool, memory, and the fault injector that wraps any of them.
#ifndef ZO_OFFLOAD_IO_IO_BACKEND_H_
#define ZO_OFFLOAD_IO_IO_BACKEND_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "offload/io/io_engine.h"

namespace zo {

struct IoPiece {
  uint64_t id = 0;             // unique among pieces in flight; comes back in the result
  uint64_t request_index = 0;  // 0-based, in the order the engine accepted requests
  uint64_t piece_index = 0;    // 0-based, in the order the engine started pieces
  IoOp op = IoOp::kRead;
  int fd = -1;
  uint64_t offset = 0;
  char* buf = nullptr;
  size_t len = 0;
};

struct IoPieceResult {
  uint64_t id = 0;
  int64_t result = 0;  // bytes moved (may be short), or -errno
};

// Thread-compatible, driven by one BlockIoEngine. Never gets more pieces in
// flight than the engine's queue depth.
class IoBackend {
 public:
  virtual ~IoBackend() = default;

  virtual std::string_view name() const = 0;

  // The engine only hands out registered fds; backends may map them to
  // something cheaper (io_uring fixed files). No pieces on `fd` are in
  // flight when it is unregistered.
  virtual absl::Status RegisterFile(int /*fd*/) { return absl::OkStatus(); }
  virtual absl::Status UnregisterFile(int /*fd*/) { return absl::OkStatus(); }

  // Called with nothing in flight. A backend that cannot register says so
  // in a status; the engine then carries on without.
  virtual absl::Status RegisterBuffers(absl::Span<const iovec> /*buffers*/) {
    return absl::OkStatus();
  }
  virtual void UnregisterBuffers() {}

  // Starts the pieces. A piece that cannot start completes with -errno.
  virtual void Submit(absl::Span<const IoPiece> pieces) = 0;

  // Appends results of pieces in flight to `out`, blocking until at least
  // `min_results` arrived (min_results <= pieces in flight). A non-OK status
  // means the backend itself broke (not one piece).
  virtual absl::Status Wait(size_t min_results, std::vector<IoPieceResult>* out) = 0;
};

// The backend CreateIoEngine(options) would build on (io_uring, the pread
// pool, or the fallback from one to the other), for callers that wrap it,
// e.g. in a FaultInjectingBackend.
absl::StatusOr<std::unique_ptr<IoBackend>> CreateIoBackend(const IoEngineOptions& options);

}  // namespace zo

#endif  // ZO_OFFLOAD_IO_IO_BACKEND_H_
