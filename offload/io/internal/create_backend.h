// What CreateIoBackend does in kAuto mode, with its two dependencies on the
// process (the io_uring factory, the log-once flag) passed in, so a test can
// make io_uring "unavailable" and count the log lines.
#ifndef ZO_OFFLOAD_IO_INTERNAL_CREATE_BACKEND_H_
#define ZO_OFFLOAD_IO_INTERNAL_CREATE_BACKEND_H_

#include <atomic>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "offload/io/io_backend.h"
#include "offload/io/io_engine.h"

namespace zo::io_internal {

using UringFactory =
    absl::FunctionRef<absl::StatusOr<std::unique_ptr<IoBackend>>(const IoEngineOptions&)>;

// io_uring from `make_uring`, else the pread pool; the first fallback that
// sees `*fallback_logged` false logs one warning with the reason and sets it.
absl::StatusOr<std::unique_ptr<IoBackend>> CreateAutoBackend(const IoEngineOptions& options,
                                                             UringFactory make_uring,
                                                             std::atomic<bool>* fallback_logged);

}  // namespace zo::io_internal

#endif  // ZO_OFFLOAD_IO_INTERNAL_CREATE_BACKEND_H_
