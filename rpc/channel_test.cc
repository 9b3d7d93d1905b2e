#include "rpc/channel.h"

#include <string>

#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/call_context.h"
#include "rpc/rpc_util.h"
#include "rpc/testing/echo_server.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using testing::IsOk;
using testing::StatusIs;

absl::Status OpenJobWithConfigOf(const std::string& address, const ChannelOptions& options,
                                 size_t config_bytes) {
  ZO_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, NewChannel(address, options));
  auto stub = v1::Offload::NewStub(channel);
  v1::OpenJobRequest request;
  request.set_config_json(std::string(config_bytes, ' '));
  v1::OpenJobResponse response;
  ZO_RETURN_IF_ERROR(FromGrpcStatus(
      stub->OpenJob(NewCallContext({.timeout = absl::Seconds(60)}).get(), request, &response)));
  if (response.status().job().size() != config_bytes) {
    return absl::InternalError("the echo is not the request");
  }
  return absl::OkStatus();
}

TEST(ChannelTest, RefusesWhatIsNotAnAddressToConnectTo) {
  EXPECT_THAT(NewChannel("127.0.0.1:0", {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'127.0.0.1:0' is not host:port (\"[address]:port\" for IPv6) "
                                 "with a port in [1, 65535]")));
  EXPECT_THAT(NewChannel("zo-server", {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'zo-server' is not")));
  EXPECT_THAT(NewChannel("127.0.0.1:7070", {.max_message_bytes = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_message_bytes")));
  EXPECT_THAT(NewChannel("127.0.0.1:7070", {.ping_every = absl::ZeroDuration()}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pings must be")));
  EXPECT_THAT(NewChannel("127.0.0.1:7070", {.ping_answered_within = absl::Microseconds(10)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("answered within 10us")));
}

TEST(ChannelTest, CarriesMessagesAboveGrpcsDefaultLimit) {
  testing::EchoServer server;
  // gRPC alone refuses to receive more than 4 MiB; the echo comes back as
  // large as the request.
  EXPECT_THAT(OpenJobWithConfigOf(server.address(), {}, 5 << 20), IsOk());
}

TEST(ChannelTest, RefusesToSendMoreThanMaxMessageBytes) {
  testing::EchoServer server;
  EXPECT_THAT(OpenJobWithConfigOf(server.address(), {.max_message_bytes = 1 << 20}, 1 << 20),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("larger than max")));
  EXPECT_THAT(OpenJobWithConfigOf(server.address(), {.max_message_bytes = 1 << 20}, 1000), IsOk());
}

TEST(ChannelTest, UnreachableServerIsUnavailable) {
  // Port 1 on loopback: nothing listens there unless root put it there.
  ZO_ASSERT_OK_AND_ASSIGN(std::shared_ptr<grpc::Channel> channel, NewChannel("127.0.0.1:1", {}));
  v1::GetServerInfoResponse response;
  EXPECT_THAT(FromGrpcStatus(v1::Offload::NewStub(channel)->GetServerInfo(
                  NewCallContext({.timeout = absl::Seconds(60)}).get(), {}, &response)),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

}  // namespace
}  // namespace zo
