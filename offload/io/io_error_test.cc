#include "offload/io/io_error.h"

#include <cerrno>

#include "absl/status/status.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::zo::testing::StatusIs;

TEST(IoErrorTest, CodesSayWhatTheCallerShouldDo) {
  EXPECT_EQ(ErrnoToStatusCode(ENOSPC), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatusCode(EDQUOT), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatusCode(EIO), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ErrnoToStatusCode(EAGAIN), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ErrnoToStatusCode(EINVAL), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrnoToStatusCode(EBADF), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrnoToStatusCode(ENOENT), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoToStatusCode(EACCES), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatusCode(EROFS), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ErrnoToStatusCode(ENOSYS), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(ErrnoToStatusCode(EXDEV), absl::StatusCode::kUnknown);
}

TEST(IoErrorTest, MessageHasContextReasonNameAndCallSite) {
  const int line = __LINE__ + 1;
  absl::Status status = ZO_ERRNO_STATUS(EIO, "read of /nvme/x.bin at offset 4096");
  EXPECT_THAT(status,
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("read of /nvme/x.bin at offset 4096: "),
                             HasSubstr("Input/output error (EIO)"),
                             HasSubstr("[io_error_test.cc:" + std::to_string(line) + "]"))));
}

TEST(IoErrorTest, ErrnoTravelsAsPayload) {
  absl::Status status = ZO_ERRNO_STATUS(ENOSPC, "write");
  EXPECT_EQ(ErrnoOf(status), ENOSPC);
  absl::Status copy = status;
  EXPECT_EQ(ErrnoOf(copy), ENOSPC);
  EXPECT_EQ(ErrnoOf(absl::InternalError("x")), std::nullopt);
}

TEST(IoErrorTest, ErrnoZeroIsStillAnError) {
  EXPECT_THAT(ZO_ERRNO_STATUS(0, "lost errno"),
              StatusIs(absl::StatusCode::kUnknown, HasSubstr("lost errno")));
}

TEST(IoErrorTest, UnnamedErrnoGetsANumber) {
  EXPECT_EQ(ErrnoName(EIO), "EIO");
  EXPECT_THAT(ErrnoName(4242), MatchesRegex("errno 4242"));
}

}  // namespace
}  // namespace zo
