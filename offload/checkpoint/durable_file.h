// Plain POSIX file I/O for durable files (checkpoint parts, checkpoint.json,
// exported weights): write and pread loops that finish short transfers and
// retry EINTR, errno turned into a status that names the file and the offset
// (offload/io/io_error.h), and the temp-name, fsync, rename, fsync-directory
// protocol that makes a file appear whole or not at all.
//
//   ZO_ASSIGN_OR_RETURN(auto out, AtomicFileWriter::Create("/ckpt/model.safetensors"));
//   ZO_RETURN_IF_ERROR(out->Append(bytes));  // into model.safetensors.tmp
//   ZO_RETURN_IF_ERROR(out->Commit());       // fsync, rename, fsync the directory
#ifndef ZO_OFFLOAD_CHECKPOINT_DURABLE_FILE_H_
#define ZO_OFFLOAD_CHECKPOINT_DURABLE_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zo {

// Writes all of `bytes` to `fd` at its current position (`offset` is where
// that is, for the message). A full disk is RESOURCE_EXHAUSTED naming `path`
// and the offset; so is a file past RLIMIT_FSIZE (EFBIG) when SIGXFSZ is
// ignored.
absl::Status WriteAll(int fd, absl::string_view bytes, const std::string& path, uint64_t offset);

// Writes all of `bytes` at `offset` without moving the file position, so
// threads may write disjoint ranges of one file at once. Errors as WriteAll.
absl::Status PwriteAll(int fd, absl::string_view bytes, uint64_t offset, const std::string& path);

// Reads exactly `len` bytes at `offset`; reaching the end of the file first
// is DATA_LOSS naming `path` and the offset (the file was cut short).
absl::Status PreadAll(int fd, char* buf, size_t len, uint64_t offset, const std::string& path);

// fsyncs `path`, a file or directory, opened read-only.
absl::Status SyncPath(const std::string& path);

// The directory part of `path` ("." when it has none).
std::string DirectoryOf(const std::string& path);

// Writes a file under `<path>.tmp` and renames it to `path` on Commit, so a
// reader sees the old file or the whole new one. Not thread-safe.
// Destroying an uncommitted writer removes the temp file.
class AtomicFileWriter {
 public:
  // Creates (truncates) `<path>.tmp`; the errno's status naming it otherwise.
  static absl::StatusOr<std::unique_ptr<AtomicFileWriter>> Create(const std::string& path);
  ~AtomicFileWriter();

  // Appends; a failure is sticky (every later call returns it).
  absl::Status Append(absl::string_view bytes);
  // fsyncs, closes, renames over `path` and fsyncs its directory.
  absl::Status Commit();

  const std::string& path() const { return path_; }
  uint64_t bytes_written() const { return offset_; }

  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

 private:
  AtomicFileWriter(int fd, std::string path);

  int fd_;
  const std::string path_;
  const std::string tmp_path_;
  uint64_t offset_ = 0;
  absl::Status error_;
  bool committed_ = false;
};

}  // namespace zo

#endif  // ZO_OFFLOAD_CHECKPOINT_DURABLE_FILE_H_
