// A file opened with O_DIRECT for the engines, owning its fd, with errors
// that say when the filesystem cannot do direct I/O at all (tmpfs before
// Linux 6.6, some FUSE and network filesystems).
//
//   ZO_ASSIGN_OR_RETURN(DirectFile file, DirectFile::Open(path, DirectFile::Mode::kCreate));
//   ZO_RETURN_IF_ERROR(file.Allocate(bytes));  // ENOSPC now rather than mid-step
//   ZO_RETURN_IF_ERROR(engine->RegisterFile(file.fd(), file.path()));
#ifndef ZO_OFFLOAD_IO_DIRECT_FILE_H_
#define ZO_OFFLOAD_IO_DIRECT_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zo {

// Move-only; closes the fd on destruction. Thread-compatible.
class DirectFile {
 public:
  enum class Mode {
    kReadOnly,
    kReadWrite,  // must exist
    kCreate,     // created, or truncated when it exists
  };

  // FAILED_PRECONDITION naming the filesystem type when it refuses O_DIRECT;
  // otherwise the errno's code (NOT_FOUND, PERMISSION_DENIED, ...).
  static absl::StatusOr<DirectFile> Open(absl::string_view path, Mode mode);

  DirectFile() = default;
  ~DirectFile();
  DirectFile(DirectFile&& other) noexcept;
  DirectFile& operator=(DirectFile&& other) noexcept;
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

  // Reserves `bytes` on disk (fallocate): RESOURCE_EXHAUSTED naming the
  // file when the disk is full.
  absl::Status Allocate(uint64_t bytes);
  absl::StatusOr<uint64_t> Size() const;
  // Closes now and reports what close says.
  absl::Status Close();

 private:
  DirectFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

// OK when files in directory `dir` can be opened and read and written with
// O_DIRECT (a probe file is created and removed); FAILED_PRECONDITION naming
// the filesystem type otherwise.
absl::Status CheckDirectIo(absl::string_view dir);

// "ext4", "tmpfs", "xfs", ... or the magic number in hex.
std::string FilesystemType(absl::string_view path);

}  // namespace zo

#endif  // ZO_OFFLOAD_IO_DIRECT_FILE_H_
