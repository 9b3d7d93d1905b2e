// A client that retries a zo-server which is not up yet reaches it once it
// listens. gRPC sees a connect attempt end only while some thread polls the
// channel, and a call on a channel whose last connect was refused fails
// without polling; in a process with no server of its own (a worker,
// zo.torch) the end of each attempt was seen by gRPC's backup poller, every
// 5 s by default, and a zo.torch script whose server came up 2 s late still
// met "connection refused" when its 10 s of retries ran out.
// SeeConnectsPromptly (rpc/channel.h) sets that poller to 100 ms.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "rpc/call_context.h"
#include "rpc/channel.h"
#include "rpc/rpc_util.h"
#include "tests/server/server_process.h"

namespace zo::testing {
namespace {

TEST(LateServerTest, ARetriedCallReachesAServerThatStartedAfterSixRefusals) {
  // A loopback port bound but not listening: connects to it are refused.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  ZO_ASSERT_OK_AND_ASSIGN(std::shared_ptr<grpc::Channel> channel,
                          NewChannel("127.0.0.1:" + std::to_string(port), {}));
  auto stub = v1::Offload::NewStub(channel);
  auto call = [&] {
    v1::GetServerInfoResponse response;
    return FromGrpcStatus(stub->GetServerInfo(
        NewCallContext({.timeout = absl::Milliseconds(500)}).get(), {}, &response));
  };
  // Retried as OffloadClient retries (50 ms doubling to 2 s, for 10 s); the
  // server starts after the sixth refusal, about 1.5 s in.
  std::optional<ServerProcess> server;
  absl::Status answered = call();
  absl::Duration backoff = absl::Milliseconds(50);
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  for (int attempt = 1; !answered.ok() && absl::Now() + backoff < give_up; ++attempt) {
    // What OffloadClient retries (a connect still under way may run out the
    // attempt's deadline).
    ASSERT_TRUE(absl::IsUnavailable(answered) || absl::IsDeadlineExceeded(answered)) << answered;
    if (attempt == 6) {
      close(fd);
      ZO_ASSERT_OK_AND_ASSIGN(server, ServerProcess::Start({}, port));
    }
    absl::SleepFor(backoff);
    backoff = std::min(2 * backoff, absl::Seconds(2));
    answered = call();
  }
  ASSERT_TRUE(server.has_value()) << "answered before the server started";
  EXPECT_THAT(answered, IsOk());
}

}  // namespace
}  // namespace zo::testing
