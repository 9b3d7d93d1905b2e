// Files as byte strings in RAM, for tests of what sits above the engine
// (the tiered store, the swap pipeline) without a disk: same checks, same
// splitting and errors as the real engines, deterministic completions.
//
//   MemoryFiles files;
//   files.set_capacity(1 << 20);  // a disk that fills up
//   ZO_ASSIGN_OR_RETURN(auto engine, CreateMemoryEngine(options, &files));
//   ZO_RETURN_IF_ERROR(engine->RegisterFile(3, "/nvme/state.bin"));  // any fd number
#ifndef ZO_OFFLOAD_IO_MEMORY_BACKEND_H_
#define ZO_OFFLOAD_IO_MEMORY_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "offload/io/io_backend.h"
#include "offload/io/io_engine.h"

namespace zo {

// Thread-safe contents of in-memory files, keyed by the fd numbers that
// requests use. A file that was never written is empty.
class MemoryFiles {
 public:
  // Space fills up in 4 KiB blocks, like a filesystem.
  static constexpr size_t kBlockBytes = 4096;

  void Set(int fd, std::string contents);
  std::string Get(int fd) const;

  // Bytes all files together may hold. A write that would go past it moves
  // what fits (whole blocks, a short count) and the next one fails ENOSPC.
  void set_capacity(size_t bytes);

  // Bytes read (0 at end of file).
  int64_t Read(int fd, uint64_t offset, char* buf, size_t len) const;
  // Bytes written, or -ENOSPC.
  int64_t Write(int fd, uint64_t offset, const char* buf, size_t len);

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, std::string> files_ ABSL_GUARDED_BY(mu_);
  size_t capacity_ ABSL_GUARDED_BY(mu_) = std::numeric_limits<size_t>::max();
  size_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

// Completes every piece at once, in submission order. `files` is borrowed
// and must outlive the backend.
std::unique_ptr<IoBackend> CreateMemoryBackend(MemoryFiles* files);

// An engine over CreateMemoryBackend, named "memory".
absl::StatusOr<std::unique_ptr<IoEngine>> CreateMemoryEngine(const IoEngineOptions& options,
                                                             MemoryFiles* files);

}  // namespace zo

#endif  // ZO_OFFLOAD_IO_MEMORY_BACKEND_H_
