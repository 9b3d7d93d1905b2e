// The one IoEngine implementation, over any IoBackend: checks requests,
// splits them into block_size pieces, keeps queue_depth pieces in flight,
// resubmits the remainder of short transfers and turns piece results into
// per-request statuses that name the file, offset, length and errno.
#ifndef ZO_OFFLOAD_IO_BLOCK_IO_ENGINE_H_
#define ZO_OFFLOAD_IO_BLOCK_IO_ENGINE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "offload/io/io_backend.h"
#include "offload/io/io_engine.h"

namespace zo {

// `name` is what IoEngine::name() returns; empty: the backend's name.
absl::StatusOr<std::unique_ptr<IoEngine>> NewBlockIoEngine(const IoEngineOptions& options,
                                                           std::unique_ptr<IoBackend> backend,
                                                           std::string name = "");

}  // namespace zo

#endif  // ZO_OFFLOAD_IO_BLOCK_IO_ENGINE_H_
