#include "rpc/rpc_util.h"

#include "gtest/gtest.h"

namespace zo {
namespace {

TEST(RpcUtilTest, StatusCodesAndMessagesCrossBothWays) {
  for (int code = 0; code <= 16; ++code) {
    const absl::Status s(static_cast<absl::StatusCode>(code), code == 0 ? "" : "why");
    const grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    EXPECT_EQ(FromGrpcStatus(g), s) << code;
  }
}

TEST(RpcUtilTest, BearerValue) { EXPECT_EQ(BearerValue("s3cret"), "Bearer s3cret"); }

}  // namespace
}  // namespace zo
