// The io_uring backend (liburing): one ring sized to the queue depth, fds in
// registered file slots, registered buffers used when a piece lies in one,
// batched submission (or one io_uring_enter per piece with single_submit),
// optional SQPOLL.
#ifndef ZO_OFFLOAD_IO_URING_BACKEND_H_
#define ZO_OFFLOAD_IO_URING_BACKEND_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/io/io_backend.h"
#include "offload/io/io_engine.h"

namespace zo {

// Sets up a ring and checks what the engine needs (the read/write opcodes,
// fixed variants included), as seastar's detect_io_uring does. The error says
// why io_uring cannot be used: UNIMPLEMENTED (no io_uring, or too old),
// PERMISSION_DENIED (disabled by sysctl or the container), RESOURCE_EXHAUSTED
// (RLIMIT_MEMLOCK, named with its value). A refused SQPOLL only logs a
// warning and gives a plain ring.
absl::StatusOr<std::unique_ptr<IoBackend>> CreateUringBackend(const IoEngineOptions& options);

// OK when CreateUringBackend would succeed with default options.
absl::Status ProbeIoUring();

}  // namespace zo

#endif  // ZO_OFFLOAD_IO_URING_BACKEND_H_
