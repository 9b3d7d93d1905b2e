#include "rpc/error_detail.h"

#include "absl/strings/cord.h"
#include "gtest/gtest.h"
#include "rpc/rpc_util.h"

namespace zo {
namespace {

v1::ErrorDetail NoJob(const std::string& job) {
  v1::ErrorDetail d;
  d.set_reason(v1::ErrorDetail::NO_JOB);
  d.set_job(job);
  return d;
}

TEST(ErrorDetailTest, ADetailCrossesTheWireAndSurvivesAPrefix) {
  const absl::Status s = WithDetail(absl::NotFoundError("no job \"j\" on this server"), NoJob("j"));
  EXPECT_EQ(ReasonOf(s), v1::ErrorDetail::NO_JOB);
  const absl::Status back = FromGrpcStatus(ToGrpcStatus(s));
  EXPECT_EQ(back.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(back.message(), s.message());
  ASSERT_TRUE(DetailOf(back).has_value());
  EXPECT_EQ(DetailOf(back)->job(), "j");
  const absl::Status relayed = FromServer("10.0.0.1:7070", back);
  EXPECT_EQ(relayed.message(), "server 10.0.0.1:7070: no job \"j\" on this server");
  EXPECT_EQ(DetailOf(relayed)->server(), "10.0.0.1:7070");
  EXPECT_EQ(ReasonOf(WithContext(relayed, "step 3")), v1::ErrorDetail::NO_JOB);
  // A relay of a relay keeps the server that answered.
  EXPECT_EQ(DetailOf(FromServer("elsewhere:1", relayed))->server(), "10.0.0.1:7070");
}

TEST(ErrorDetailTest, TheTrailerIsAGoogleRpcStatus) {
  // Decoded as google.rpc.Status would be (same field numbers): code,
  // message and one Any whose type URL names the detail.
  const grpc::Status g = ToGrpcStatus(WithDetail(absl::NotFoundError("no job"), NoJob("j")));
  v1::RpcStatus trailer;
  ASSERT_TRUE(trailer.ParseFromString(g.error_details()));
  EXPECT_EQ(trailer.code(), 5);
  EXPECT_EQ(trailer.message(), "no job");
  ASSERT_EQ(trailer.details_size(), 1);
  EXPECT_EQ(trailer.details(0).type_url(), kErrorDetailUrl);
}

TEST(ErrorDetailTest, UntypedAndMalformedDetailsAreNoReason) {
  EXPECT_EQ(ReasonOf(absl::NotFoundError("no job \"j\"")), v1::ErrorDetail::REASON_UNSPECIFIED);
  EXPECT_EQ(ReasonOf(absl::OkStatus()), v1::ErrorDetail::REASON_UNSPECIFIED);
  EXPECT_TRUE(WithDetail(absl::OkStatus(), NoJob("j")).ok());
  absl::Status garbage = absl::NotFoundError("x");
  garbage.SetPayload(kErrorDetailUrl, absl::Cord("\xff\xff\xff"));
  EXPECT_EQ(DetailOf(garbage), std::nullopt);
  // Hostile trailers from a peer: ignored, the code and message kept.
  for (const std::string& details : {std::string("\xff\x01garbage"), std::string(1, '\0')}) {
    const absl::Status s = FromGrpcStatus(grpc::Status(grpc::StatusCode::NOT_FOUND, "m", details));
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(s.message(), "m");
    EXPECT_EQ(DetailOf(s), std::nullopt);
  }
}

}  // namespace
}  // namespace zo
