#include "offload/io/io_error.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/types/optional.h"

namespace zo {
namespace {

constexpr char kErrnoPayloadUrl[] = "type.zo.dev/errno";

const char* Basename(const char* path) {
  const char* base = path;
  for (const char* p = path; *p != '\0'; ++p) {
    if (*p == '/') base = p + 1;
  }
  return base;
}

}  // namespace

absl::StatusCode ErrnoToStatusCode(int err) {
  switch (err) {
    case 0:
      return absl::StatusCode::kOk;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::StatusCode::kResourceExhausted;
    case EIO:
      return absl::StatusCode::kDataLoss;
    case EINTR:
    case EAGAIN:
    case EBUSY:
    case ETIMEDOUT:
      return absl::StatusCode::kUnavailable;
    case EINVAL:
    case EBADF:
    case EFAULT:
    case EISDIR:
    case ENAMETOOLONG:
      return absl::StatusCode::kInvalidArgument;
    case ENOENT:
      return absl::StatusCode::kNotFound;
    case EEXIST:
      return absl::StatusCode::kAlreadyExists;
    case EACCES:
    case EPERM:
      return absl::StatusCode::kPermissionDenied;
    case EROFS:
    case ENOTDIR:
      return absl::StatusCode::kFailedPrecondition;
    case ENOSYS:
    case EOPNOTSUPP:
      return absl::StatusCode::kUnimplemented;
    default:
      return absl::StatusCode::kUnknown;
  }
}

std::string ErrnoName(int err) {
  const char* name = strerrorname_np(err);
  if (name != nullptr) return name;
  return absl::StrCat("errno ", err);
}

absl::Status ErrnoToStatus(int err, absl::string_view context, const char* file, int line) {
  absl::StatusCode code = ErrnoToStatusCode(err);
  // errno 0 means the caller lost the real errno; still an error, never OK.
  if (code == absl::StatusCode::kOk) code = absl::StatusCode::kUnknown;
  absl::Status status(code, absl::StrCat(context, ": ", std::strerror(err), " (", ErrnoName(err),
                                         ") [", Basename(file), ":", line, "]"));
  status.SetPayload(kErrnoPayloadUrl, absl::Cord(absl::StrCat(err)));
  return status;
}

std::optional<int> ErrnoOf(const absl::Status& status) {
  absl::optional<absl::Cord> payload = status.GetPayload(kErrnoPayloadUrl);
  int err = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &err)) return std::nullopt;
  return err;
}

}  // namespace zo
