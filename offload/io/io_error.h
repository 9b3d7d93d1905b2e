// errno -> absl::Status at the boundary with the kernel, in the spirit of
// leveldb's PosixError: the code says what the caller should do, the message
// says what failed (the caller's context), why (strerror and the errno name)
// and where (file:line of the call site).
//
//   if (fstat(fd, &st) != 0) return ZO_ERRNO_STATUS(errno, absl::StrCat("fstat ", path));
//   // -> INVALID_ARGUMENT "fstat /x/y: Bad file descriptor (EBADF) [foo.cc:12]"
//
// Codes (what the caller does next):
//   ENOSPC EDQUOT EFBIG ENOMEM EMFILE ENFILE  RESOURCE_EXHAUSTED  free space / memory, then retry
//   EIO                                         DATA_LOSS  the device lost the bytes: restore
//                                                          from the checkpoint, do not retry
//   EINTR EAGAIN EBUSY ETIMEDOUT                UNAVAILABLE  retry the call
//   EINVAL EBADF EFAULT EISDIR ENAMETOOLONG     INVALID_ARGUMENT  the request is wrong
//   ENOENT                                      NOT_FOUND
//   EEXIST                                      ALREADY_EXISTS
//   EACCES EPERM                                PERMISSION_DENIED
//   EROFS ENOTDIR                               FAILED_PRECONDITION  fix the environment
//   ENOSYS EOPNOTSUPP                           UNIMPLEMENTED
//   anything else                               UNKNOWN
// The errno itself travels as a payload; ErrnoOf() reads it back.
#ifndef ZO_OFFLOAD_IO_IO_ERROR_H_
#define ZO_OFFLOAD_IO_IO_ERROR_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace zo {

// The status code for `err` (see the table above).
absl::StatusCode ErrnoToStatusCode(int err);

// "<context>: <strerror> (<ENAME>) [<file basename>:<line>]" with the code
// from ErrnoToStatusCode and the errno attached as a payload. Prefer the
// ZO_ERRNO_STATUS macro, which fills in the call site.
absl::Status ErrnoToStatus(int err, absl::string_view context, const char* file, int line);

// The errno a status was built from, if any (survives copies, not rewording).
std::optional<int> ErrnoOf(const absl::Status& status);

// "EIO", "ENOSPC", ...; "errno 1234" for numbers the C library does not name.
std::string ErrnoName(int err);

}  // namespace zo

#define ZO_ERRNO_STATUS(err, context) ::zo::ErrnoToStatus((err), (context), __FILE__, __LINE__)

#endif  // ZO_OFFLOAD_IO_IO_ERROR_H_
