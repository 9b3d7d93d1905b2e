#include "offload/io/direct_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "offload/aligned_buffer.h"
#include "offload/io/io_error.h"

namespace zo {

std::string FilesystemType(absl::string_view path) {
  struct statfs fs {};
  if (statfs(std::string(path).c_str(), &fs) != 0) return "unknown";
  switch (static_cast<uint64_t>(fs.f_type)) {
    case 0xEF53:
      return "ext4";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x01021994:
      return "tmpfs";
    case 0x794c7630:
      return "overlayfs";
    case 0x65735546:
      return "fuse";
    case 0x6969:
      return "nfs";
    case 0x2FC12FC1:
      return "zfs";
    default:
      return absl::StrCat("filesystem magic 0x", absl::Hex(fs.f_type));
  }
}

namespace {

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

absl::Status NoDirectIo(const std::string& path, absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, " ", path, ": the filesystem (", FilesystemType(Dirname(path)),
                   ") does not support O_DIRECT; put NVMe state on a local disk (ext4, xfs)"));
}

}  // namespace

absl::StatusOr<DirectFile> DirectFile::Open(absl::string_view path, Mode mode) {
  std::string p(path);
  int flags = O_DIRECT | O_CLOEXEC;
  switch (mode) {
    case Mode::kReadOnly:
      flags |= O_RDONLY;
      break;
    case Mode::kReadWrite:
      flags |= O_RDWR;
      break;
    case Mode::kCreate:
      flags |= O_RDWR | O_CREAT | O_TRUNC;
      break;
  }
  const int fd = open(p.c_str(), flags, 0644);
  if (fd < 0) {
    const int err = errno;
    if (err == EINVAL) return NoDirectIo(p, "open O_DIRECT");
    return ZO_ERRNO_STATUS(err, absl::StrCat("open O_DIRECT ", p));
  }
  return DirectFile(fd, std::move(p));
}

DirectFile::~DirectFile() {
  if (fd_ >= 0) close(fd_);
}

DirectFile::DirectFile(DirectFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

DirectFile& DirectFile::operator=(DirectFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

absl::Status DirectFile::Allocate(uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  const int err = posix_fallocate(fd_, 0, static_cast<off_t>(bytes));
  if (err != 0)
    return ZO_ERRNO_STATUS(err, absl::StrCat("fallocate ", bytes, " bytes for ", path_));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> DirectFile::Size() const {
  struct stat st {};
  if (fstat(fd_, &st) != 0) return ZO_ERRNO_STATUS(errno, absl::StrCat("fstat ", path_));
  return static_cast<uint64_t>(st.st_size);
}

absl::Status DirectFile::Close() {
  if (fd_ < 0) return absl::OkStatus();
  const int fd = std::exchange(fd_, -1);
  if (close(fd) != 0) return ZO_ERRNO_STATUS(errno, absl::StrCat("close ", path_));
  return absl::OkStatus();
}

absl::Status CheckDirectIo(absl::string_view dir) {
  std::string name = absl::StrCat(dir, "/.zo_direct_io_probe_XXXXXX");
  const int made = mkstemp(name.data());
  if (made < 0) return ZO_ERRNO_STATUS(errno, absl::StrCat("create a probe file in ", dir));
  close(made);
  absl::Status status;
  {
    absl::StatusOr<DirectFile> file = DirectFile::Open(name, DirectFile::Mode::kReadWrite);
    absl::StatusOr<AlignedBuffer> buf = AlignedBuffer::Allocate(kPageBytes);
    if (!file.ok()) {
      status = file.status();
    } else if (!buf.ok()) {
      status = buf.status();
    } else {
      errno = 0;
      const bool moved = pwrite(file->fd(), buf->data(), kPageBytes, 0) == kPageBytes &&
                         pread(file->fd(), buf->data(), kPageBytes, 0) == kPageBytes;
      const int err = errno;
      // Some filesystems take the flag and refuse the I/O.
      if (!moved && err == EINVAL) {
        status = NoDirectIo(name, "O_DIRECT I/O on");
      } else if (!moved) {
        status = err != 0 ? ZO_ERRNO_STATUS(err, absl::StrCat("O_DIRECT I/O on ", name))
                          : absl::DataLossError(absl::StrCat("O_DIRECT I/O on ", name,
                                                             ": short transfer of a 4 KiB probe"));
      }
    }
  }
  unlink(name.c_str());
  return status;
}

}  // namespace zo
