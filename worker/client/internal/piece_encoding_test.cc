#include "worker/client/internal/piece_encoding.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace zo::client_internal {
namespace {

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// protobuf parses the hand-built bytes into the message set_data would give.
TEST(PieceEncodingTest, ParsesAsTheSameGradientPiece) {
  std::mt19937 rng(1);
  for (size_t size : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{16383},
                      size_t{16384}, size_t{1} << 20}) {
    std::vector<std::byte> data(size);
    for (std::byte& b : data) b = static_cast<std::byte>(rng());
    v1::GradientPiece header;
    header.set_job("job-1");
    header.set_step(12345678901);
    header.set_dp_rank(3);
    header.set_chunk(77);
    header.set_offset(4096);
    header.set_dtype(v1::DTYPE_BF16);
    header.set_resend(size % 2 == 1);
    const EncodedPiece piece = EncodeGradientPiece(header, data.data(), data.size());
    EXPECT_EQ(piece.payload_bytes, static_cast<int64_t>(size));
    EXPECT_EQ(piece.resend, header.resend());

    v1::GradientPiece parsed;
    ASSERT_TRUE(parsed.ParseFromString(Flatten(piece.buffer))) << size;
    v1::GradientPiece expected = header;
    expected.set_data(reinterpret_cast<const char*>(data.data()), data.size());
    EXPECT_EQ(parsed.SerializeAsString(), expected.SerializeAsString()) << size;
  }
}

}  // namespace
}  // namespace zo::client_internal
