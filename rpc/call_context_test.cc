#include "rpc/call_context.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/channel.h"
#include "rpc/rpc_util.h"
#include "rpc/testing/echo_server.h"

namespace zo {
namespace {

using testing::IsOk;

TEST(CallContextTest, DeadlineIsTimeoutFromWhenTheContextIsMade) {
  const absl::Time before = absl::Now();
  std::unique_ptr<grpc::ClientContext> context = NewCallContext({.timeout = absl::Minutes(3)});
  const absl::Time after = absl::Now();
  const absl::Time deadline = absl::FromChrono(context->deadline());
  EXPECT_GE(deadline, before + absl::Minutes(3));
  EXPECT_LE(deadline, after + absl::Minutes(3));
}

// What the server sees of a call made with `options`.
v1::GetServerInfoResponse Echo(const CallOptions& options) {
  testing::EchoServer server;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = NewChannel(server.address(), {});
  EXPECT_THAT(channel, IsOk());
  v1::GetServerInfoResponse response;
  grpc::ClientContext context;
  PrepareCallContext(options, context);
  EXPECT_THAT(
      FromGrpcStatus(v1::Offload::NewStub(*channel)->GetServerInfo(&context, {}, &response)),
      IsOk());
  return response;
}

TEST(CallContextTest, ServerSeesTheBearerTokenAndTheDeadline) {
  const v1::GetServerInfoResponse seen =
      Echo({.timeout = absl::Seconds(60), .auth_token = "s3cret"});
  EXPECT_EQ(seen.version(), "Bearer s3cret");
  EXPECT_EQ(seen.max_message_bytes(), 1) << "the call reached the server without a deadline";
}

TEST(CallContextTest, NoTokenNoAuthorizationMetadata) {
  EXPECT_EQ(Echo({.timeout = absl::Seconds(60)}).version(), "");
}

}  // namespace
}  // namespace zo
