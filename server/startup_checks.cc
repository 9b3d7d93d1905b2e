#include "server/startup_checks.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "offload/io/direct_file.h"

namespace zo {
namespace {

absl::Status Refused(const std::string& flag, const std::string& dir, const std::string& why) {
  return absl::FailedPreconditionError(absl::StrCat(flag, " ", dir, ": ", why));
}

// Creates `dir` and its parents when missing; it must then be a directory.
absl::Status MakeDir(const std::string& dir, const std::string& flag) {
  if (dir.empty()) return Refused(flag, "''", "an empty path");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Refused(flag, dir, absl::StrCat("cannot create it: ", ec.message()));
  if (!std::filesystem::is_directory(dir, ec)) return Refused(flag, dir, "not a directory");
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckCheckpointDir(const std::string& dir, const std::string& flag) {
  if (absl::Status s = MakeDir(dir, flag); !s.ok()) return s;
  const auto full = [&](int error) {
    ZO_LOG(WARNING) << flag << " " << dir << " is full (" << strerror(error)
                    << "): starting anyway; checkpoints fail until there is room, restores "
                       "still read it";
    return absl::OkStatus();
  };
  const std::string probe = absl::StrCat(dir, "/.zo-write-check-", getpid());
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == ENOSPC || errno == EDQUOT) return full(errno);
    return Refused(flag, dir, absl::StrCat("cannot write in it: ", strerror(errno)));
  }
  const char byte = 0;
  const bool written = write(fd, &byte, 1) == 1 && fsync(fd) == 0;
  const int error = errno;
  close(fd);
  unlink(probe.c_str());
  if (!written && (error == ENOSPC || error == EDQUOT)) return full(error);
  if (!written) return Refused(flag, dir, absl::StrCat("a write failed: ", strerror(error)));
  return absl::OkStatus();
}

absl::Status CheckNvmeDir(const std::string& dir, const std::string& flag) {
  if (absl::Status s = MakeDir(dir, flag); !s.ok()) return s;
  if (absl::Status s = CheckDirectIo(dir); !s.ok()) {
    return Refused(flag, dir, std::string(s.message()));
  }
  return absl::OkStatus();
}

}  // namespace zo
