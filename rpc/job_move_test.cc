#include "rpc/job_move.h"

#include "gtest/gtest.h"

namespace zo {
namespace {

TEST(JobMoveTest, RoundTripsThroughAStatusAndAPrefix) {
  const JobMove move{
      .job = "gpt-2.small", .servers = {"10.0.0.3:7070", "[::1]:7071"}, .version = 120};
  const absl::Status s = JobMovedError(move);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "job gpt-2.small moved to servers [10.0.0.3:7070,[::1]:7071] at version 120");
  EXPECT_EQ(ParseJobMove(s), move);
  // As the client quotes it: the server's address first.
  EXPECT_EQ(ParseJobMove(absl::FailedPreconditionError(absl::StrCat(
                "server 10.0.0.1:7070: ", s.message(), " (gave up after 3 attempts)"))),
            move);
}

TEST(JobMoveTest, OtherStatusesAreNoMove) {
  EXPECT_EQ(ParseJobMove(absl::OkStatus()), std::nullopt);
  EXPECT_EQ(ParseJobMove(absl::NotFoundError("job x moved to servers [a:1] at version 3")),
            std::nullopt);
  EXPECT_EQ(ParseJobMove(absl::FailedPreconditionError("job x needs restore")), std::nullopt);
  EXPECT_EQ(ParseJobMove(absl::FailedPreconditionError("job x moved to servers [] at version 3")),
            std::nullopt);
  EXPECT_EQ(ParseJobMove(absl::FailedPreconditionError("job x moved to servers [a:1] at version ")),
            std::nullopt);
}

}  // namespace
}  // namespace zo
