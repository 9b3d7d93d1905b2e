#include "common/testing/small_tmpfs.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"

namespace zo::testing {

SmallTmpfs::SmallTmpfs(const std::string& dir, const std::string& size) : dir_(dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, absl::StrCat("size=", size).c_str()) != 0) {
    error_ = absl::StrCat("cannot mount a tmpfs at ", dir,
                          " (needs root with CAP_SYS_ADMIN): ", std::strerror(errno));
  }
}

SmallTmpfs::~SmallTmpfs() {
  if (mounted()) umount2(dir_.c_str(), MNT_DETACH);
}

absl::Status SmallTmpfs::Fill() {
  struct statvfs fs {};
  if (statvfs(dir_.c_str(), &fs) != 0) {
    return absl::InternalError(absl::StrCat("statvfs ", dir_, ": ", std::strerror(errno)));
  }
  const int fd = open(Filler().c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("open ", Filler(), ": ", std::strerror(errno)));
  }
  const off_t bytes = static_cast<off_t>(fs.f_bavail) * static_cast<off_t>(fs.f_frsize);
  if (posix_fallocate(fd, 0, bytes) != 0) {
    // Whatever the last few pages are: write until the disk says no.
    std::vector<char> zeros(1 << 16, 0);
    while (write(fd, zeros.data(), zeros.size()) > 0) {
    }
  }
  close(fd);
  return absl::OkStatus();
}

void SmallTmpfs::Free() {
  std::error_code ignored;
  std::filesystem::remove(Filler(), ignored);
}

}  // namespace zo::testing
