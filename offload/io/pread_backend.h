// The portable backend: a few threads doing pread/pwrite, one piece each at
// a time. Used where io_uring cannot be set up (CreateIoEngine falls back to
// it with one log line) and as a second real engine to test against.
#ifndef ZO_OFFLOAD_IO_PREAD_BACKEND_H_
#define ZO_OFFLOAD_IO_PREAD_BACKEND_H_

#include <memory>

#include "offload/io/io_backend.h"

namespace zo {

// `threads` >= 1 workers, started now and joined on destruction.
std::unique_ptr<IoBackend> CreatePreadBackend(int threads);

}  // namespace zo

#endif  // ZO_OFFLOAD_IO_PREAD_BACKEND_H_
