#include "rpc/job_move.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "rpc/error_detail.h"
#include "rpc/rpc_util.h"

namespace zo {
namespace {

TEST(JobMoveTest, RoundTripsThroughAStatusAPrefixAndTheWire) {
  const JobMove move{
      .job = "gpt-2.small", .servers = {"10.0.0.3:7070", "[::1]:7071"}, .version = 120};
  const absl::Status s = JobMovedError(move);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "job gpt-2.small moved to servers [10.0.0.3:7070,[::1]:7071] at version 120");
  EXPECT_EQ(ParseJobMove(s), move);
  // As the client relays it, across gRPC.
  EXPECT_EQ(ParseJobMove(FromServer("10.0.0.1:7070", FromGrpcStatus(ToGrpcStatus(s)))), move);
}

TEST(JobMoveTest, TheMessageAloneIsNoMove) {
  const JobMove move{.job = "x", .servers = {"a:1"}, .version = 3};
  const absl::Status s = JobMovedError(move);
  EXPECT_EQ(ParseJobMove(absl::FailedPreconditionError(s.message())), std::nullopt);
  EXPECT_EQ(ParseJobMove(absl::OkStatus()), std::nullopt);
  // The detail under another code is not a move either.
  absl::Status other(absl::StatusCode::kNotFound, "whatever");
  s.ForEachPayload([&](absl::string_view url, const absl::Cord& p) { other.SetPayload(url, p); });
  EXPECT_EQ(ParseJobMove(other), std::nullopt);
  // Reworded, it still is one.
  EXPECT_EQ(ParseJobMove(WithContext(s, "anything at all")), move);
}

}  // namespace
}  // namespace zo
