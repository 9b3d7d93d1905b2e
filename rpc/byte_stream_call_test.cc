#include "rpc/byte_stream_call.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "proto/zo/v1/params.pb.h"
#include "rpc/testing/echo_server.h"

namespace zo {
namespace {

constexpr char kMethod[] = "/zo.v1.Offload/InitParams";

grpc::ByteBuffer Piece(const std::string& job, int64_t offset) {
  v1::ParamInitPiece piece;
  piece.set_job(job);
  piece.set_offset(offset);
  piece.set_data(std::string(1000, 'x'));
  const std::string bytes = piece.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

class ByteStreamCallTest : public ::testing::Test {
 protected:
  testing::EchoServer server_;  // before the channel that names its port
  std::shared_ptr<grpc::Channel> channel_ =
      grpc::CreateChannel(server_.address(), grpc::InsecureChannelCredentials());
};

TEST_F(ByteStreamCallTest, WritesEveryMessageAndReadsTheResponse) {
  grpc::ClientContext context;
  ByteStreamCall call(channel_, &context, kMethod);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(call.Write(Piece("job", i)));
  v1::InitParamsResponse response;
  const grpc::Status s = call.Finish(&response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.pieces(), 100);
  EXPECT_FALSE(call.Write(Piece("job", 100))) << "no write after Finish";
}

TEST_F(ByteStreamCallTest, AServerThatEndsTheCallEarlyIsHeardAtFinish) {
  grpc::ClientContext context;
  ByteStreamCall call(channel_, &context, kMethod);
  ASSERT_TRUE(call.Write(Piece("refuse", 0)));
  // Later writes may still be taken or fail; none hangs, and Finish says why.
  for (int i = 1; i < 50 && call.Write(Piece("job", i)); ++i) {
  }
  v1::InitParamsResponse response;
  const grpc::Status s = call.Finish(&response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "refused piece");
}

TEST_F(ByteStreamCallTest, ACancelledCallEndsCancelledAndAnUnfinishedOneEndsOnDestruction) {
  grpc::ClientContext context;
  ByteStreamCall call(channel_, &context, kMethod);
  ASSERT_TRUE(call.Write(Piece("job", 0)));
  context.TryCancel();
  for (int i = 1; i < 50 && call.Write(Piece("job", i)); ++i) {
  }
  EXPECT_EQ(call.Finish(nullptr).error_code(), grpc::StatusCode::CANCELLED);

  grpc::ClientContext other;
  auto unfinished = std::make_unique<ByteStreamCall>(channel_, &other, kMethod);
  ASSERT_TRUE(unfinished->Write(Piece("job", 0)));
  unfinished.reset();  // half-closes and waits for the end
}

}  // namespace
}  // namespace zo
