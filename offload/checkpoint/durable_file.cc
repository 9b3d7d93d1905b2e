#include "offload/checkpoint/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "offload/io/io_error.h"

namespace zo {

namespace {

// The loop of WriteAll and PwriteAll; `positional`: pwrite at `offset`,
// else write at the file position (`offset` names it in messages).
absl::Status WriteLoop(int fd, absl::string_view bytes, const std::string& path, uint64_t offset,
                       bool positional) {
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n =
        positional ? pwrite(fd, p, left, static_cast<off_t>(offset)) : write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ZO_ERRNO_STATUS(
          errno, absl::StrCat("write ", left, " bytes at offset ", offset, " of ", path));
    }
    // write() returning 0 for a non-empty buffer does not happen on regular
    // files; treat it as the full disk it would be rather than loop forever.
    if (n == 0) {
      return ZO_ERRNO_STATUS(ENOSPC, absl::StrCat("write ", left, " bytes at offset ", offset,
                                                  " of ", path, " wrote nothing"));
    }
    p += n;
    left -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteAll(int fd, absl::string_view bytes, const std::string& path, uint64_t offset) {
  return WriteLoop(fd, bytes, path, offset, /*positional=*/false);
}

absl::Status PwriteAll(int fd, absl::string_view bytes, uint64_t offset, const std::string& path) {
  return WriteLoop(fd, bytes, path, offset, /*positional=*/true);
}

absl::Status PreadAll(int fd, char* buf, size_t len, uint64_t offset, const std::string& path) {
  while (len > 0) {
    const ssize_t n = pread(fd, buf, len, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ZO_ERRNO_STATUS(errno,
                             absl::StrCat("read ", len, " bytes at offset ", offset, " of ", path));
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat("unexpected end of file at offset ", offset, " of ",
                                              path, " (", len,
                                              " more bytes expected): the file was cut short"));
    }
    buf += n;
    len -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status SyncPath(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ZO_ERRNO_STATUS(errno, absl::StrCat("open ", path, " to fsync it"));
  absl::Status status;
  if (fsync(fd) != 0) status = ZO_ERRNO_STATUS(errno, absl::StrCat("fsync ", path));
  close(fd);
  return status;
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::StatusOr<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Create(
    const std::string& path) {
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ZO_ERRNO_STATUS(errno, absl::StrCat("create ", tmp));
  return std::unique_ptr<AtomicFileWriter>(new AtomicFileWriter(fd, path));
}

AtomicFileWriter::AtomicFileWriter(int fd, std::string path)
    : fd_(fd), path_(std::move(path)), tmp_path_(path_ + ".tmp") {}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) close(fd_);
  if (!committed_) unlink(tmp_path_.c_str());
}

absl::Status AtomicFileWriter::Append(absl::string_view bytes) {
  if (!error_.ok()) return error_;
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(tmp_path_, " is closed"));
  error_ = WriteAll(fd_, bytes, tmp_path_, offset_);
  if (error_.ok()) offset_ += bytes.size();
  return error_;
}

absl::Status AtomicFileWriter::Commit() {
  if (!error_.ok()) return error_;
  if (committed_) return absl::OkStatus();
  if (fsync(fd_) != 0) {
    error_ = ZO_ERRNO_STATUS(errno, absl::StrCat("fsync ", tmp_path_));
    return error_;
  }
  const int fd = std::exchange(fd_, -1);
  if (close(fd) != 0) {
    error_ = ZO_ERRNO_STATUS(errno, absl::StrCat("close ", tmp_path_));
    return error_;
  }
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    error_ = ZO_ERRNO_STATUS(errno, absl::StrCat("rename ", tmp_path_, " to ", path_));
    return error_;
  }
  committed_ = true;
  // The rename is durable once the directory entry is.
  error_ = SyncPath(DirectoryOf(path_));
  return error_;
}

}  // namespace zo
