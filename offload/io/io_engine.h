// The NVMe tier's I/O engine: batches of reads and writes against O_DIRECT
// files, each request split into `block_size` pieces kept `queue_depth` deep,
// completions reaped per whole request. See offload/io/design.md.
//
//   ZO_ASSIGN_OR_RETURN(auto engine, CreateIoEngine(IoEngineOptionsFromConfig(config.aio)));
//   ZO_RETURN_IF_ERROR(engine->RegisterFile(file.fd(), file.path()));
//   ZO_RETURN_IF_ERROR(engine->Submit({{IoOp::kRead, file.fd(), 0, buf, len, /*tag=*/7}}));
//   ZO_ASSIGN_OR_RETURN(std::vector<IoCompletion> done, engine->Reap(1));
//   // done[0].tag == 7; done[0].status says how it went, with the file, offset and errno.
#ifndef ZO_OFFLOAD_IO_IO_ENGINE_H_
#define ZO_OFFLOAD_IO_IO_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/config.h"

namespace zo {

class AlignedBufferPool;

enum class IoOp { kRead, kWrite };
const char* IoOpName(IoOp op);  // "read" / "write"

// One transfer between `buf` and the file behind `fd`. With the default
// options `offset`, `len` and the address `buf` are multiples of 4096
// (O_DIRECT). `buf` must stay valid until the request is reaped.
struct IoRequest {
  IoOp op = IoOp::kRead;
  int fd = -1;  // registered with the engine (RegisterFile)
  uint64_t offset = 0;
  void* buf = nullptr;
  size_t len = 0;
  uint64_t tag = 0;  // the caller's; comes back in the completion, need not be unique
};

// A whole request, done. `status` is OK only when all `len` bytes moved.
struct IoCompletion {
  uint64_t tag = 0;
  absl::Status status;
};

enum class IoEngineKind {
  kAuto,     // io_uring when it can be set up, else the pread pool (one log line)
  kIoUring,  // io_uring or an error saying why not
  kPread,    // the portable pread/pwrite thread pool
};

struct IoEngineOptions {
  IoEngineKind kind = IoEngineKind::kAuto;
  size_t block_size = size_t{1} << 20;  // largest piece; power of two, multiple of alignment
  int queue_depth = 8;                  // pieces in flight at most; 1..4096
  size_t alignment = 4096;              // O_DIRECT rule for offset, len and buffer address
  bool single_submit = false;           // io_uring: one system call per piece (DeepSpeed's knob)
  bool sqpoll = false;                  // io_uring: kernel thread polls the queue (no syscalls)
  int sqpoll_idle_ms = 50;              // io_uring: SQPOLL thread sleeps after this idle time
  int max_files = 64;                   // io_uring: registered file slots (more files still work)
  int pread_threads = 0;                // pread pool threads; 0: queue_depth
};

// The `aio` config section as engine options (intra_op_parallelism and
// overlap_events have no meaning for one engine: it always overlaps).
IoEngineOptions IoEngineOptionsFromConfig(const AioConfig& aio);

// INVALID_ARGUMENT naming the option when `options` cannot work.
absl::Status ValidateIoEngineOptions(const IoEngineOptions& options);

// Thread-compatible: one thread at a time may call an engine (the pread pool
// runs its own threads inside). Destroying an engine waits for the pieces
// already handed to the kernel (their buffers are in use) and drops the rest.
class IoEngine {
 public:
  virtual ~IoEngine() = default;

  // "io_uring", "pread", "memory", "faulty(io_uring)"...
  virtual std::string_view name() const = 0;
  virtual const IoEngineOptions& options() const = 0;

  // Makes `fd` usable in requests; `path` names it in errors. The caller
  // keeps `fd` open until UnregisterFile (or the engine's end).
  virtual absl::Status RegisterFile(int fd, absl::string_view path) = 0;
  // FAILED_PRECONDITION while requests on `fd` are in flight.
  virtual absl::Status UnregisterFile(int fd) = 0;

  // Lets the engine use `pool`'s buffers as io_uring registered buffers (no
  // page pinning per request). Optional: any aligned memory works without
  // it. `pool` must outlive the registration (UnregisterBuffers or the
  // engine's end). FAILED_PRECONDITION while requests are in flight. If the
  // kernel refuses (RLIMIT_MEMLOCK) the engine logs once and carries on
  // with plain buffers.
  virtual absl::Status RegisterBuffers(const AlignedBufferPool& pool) = 0;
  virtual absl::Status UnregisterBuffers() = 0;

  // Checks every request (INVALID_ARGUMENT naming the request, file, offset,
  // length and rule; nothing is queued then) and queues them, splitting each
  // into block_size pieces; starts as many as the queue depth allows.
  virtual absl::Status Submit(absl::Span<const IoRequest> requests) = 0;

  // Waits until at least `min_complete` whole requests have completed and
  // returns every completed one (in completion order); 0 never blocks.
  // Errors of single requests are in their completion. The call itself fails
  // only for misuse (min_complete above in_flight()) or a broken engine
  // (the ring failed); a broken engine stays broken.
  virtual absl::StatusOr<std::vector<IoCompletion>> Reap(size_t min_complete) = 0;

  // Requests submitted and not yet returned by Reap.
  virtual size_t in_flight() const = 0;
};

// An engine of the kind asked for (see IoEngineKind).
absl::StatusOr<std::unique_ptr<IoEngine>> CreateIoEngine(const IoEngineOptions& options);

// One request, submitted and waited for. FAILED_PRECONDITION when other
// requests are in flight (their completions would be lost).
absl::Status ReadFully(IoEngine& engine, int fd, uint64_t offset, void* buf, size_t len);
absl::Status WriteFully(IoEngine& engine, int fd, uint64_t offset, const void* buf, size_t len);

}  // namespace zo

#endif  // ZO_OFFLOAD_IO_IO_ENGINE_H_
