#include "worker/client/internal/piece_encoding.h"

#include <memory>
#include <optional>
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
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// protobuf parses the hand-built bytes into the message set_data would give.
TEST(PieceEncodingTest, ParsesAsTheSameGradientPiece) {
  std::mt19937 rng(1);
  for (size_t size : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{16383}, size_t{16384},
                      size_t{1} << 20}) {
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
    v1::GradientPiece expected = header;
    expected.set_data(reinterpret_cast<const char*>(data.data()), data.size());
    // Copied, and sent in place with the caller's buffer as a second slice.
    auto owner = std::make_shared<int>(0);
    for (bool shared : {false, true}) {
      const EncodedPiece piece =
          EncodeGradientPiece(header, data.data(), data.size(), shared ? owner : nullptr);
      EXPECT_EQ(piece.payload_bytes, static_cast<int64_t>(size));
      EXPECT_EQ(piece.resend, header.resend());
      v1::GradientPiece parsed;
      ASSERT_TRUE(parsed.ParseFromString(Flatten(piece.buffer))) << size;
      EXPECT_EQ(parsed.SerializeAsString(), expected.SerializeAsString()) << size;
    }
  }
}

// The in-place payload points into the caller's bytes and keeps their owner
// alive exactly as long as gRPC holds the buffer.
TEST(PieceEncodingTest, SharedPayloadIsNotCopiedAndHoldsItsOwner) {
  auto bytes = std::make_shared<std::vector<std::byte>>(4096, std::byte{7});
  std::weak_ptr<std::vector<std::byte>> watch = bytes;
  v1::GradientPiece header;
  header.set_job("j");
  std::optional<EncodedPiece> piece = EncodeGradientPiece(header, bytes->data() + 100, 1000, bytes);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(piece->buffer.Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(static_cast<const void*>(slices[1].begin()),
            static_cast<const void*>(bytes->data() + 100));
  bytes.reset();
  EXPECT_FALSE(watch.expired());  // the piece (and the dumped slices) hold it
  slices.clear();
  piece.reset();
  EXPECT_TRUE(watch.expired());
}

}  // namespace
}  // namespace zo::client_internal
