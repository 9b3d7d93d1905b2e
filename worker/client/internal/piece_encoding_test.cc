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

// Region pieces queued together go as one message: the first's header with
// the others, in order, as more_ranges; pieces of another step, region or
// micro-batch do not join it.
TEST(PieceEncodingTest, RegionPiecesGoAsOneMessageInOrder) {
  std::vector<EncodedPiece> pieces;
  for (int k = 0; k < 3; ++k) {
    v1::GradientPiece header;
    header.set_job("job-1");
    header.set_step(5);
    header.set_dtype(v1::DTYPE_BF16);
    header.set_incarnation(99);
    header.set_region(42);
    header.set_chunk(k);
    header.set_offset(10 * k);
    header.set_region_offset(1000 * k);
    header.set_region_bytes(64 + k);
    header.set_region_ack_offset(64);
    header.set_region_ack(k + 1);
    pieces.push_back(EncodeRegionPiece(header));
    EXPECT_EQ(pieces.back().payload_bytes, 0);
    ASSERT_TRUE(pieces.back().region_header.has_value());
  }
  EXPECT_TRUE(SameRegionMessage(*pieces[0].region_header, *pieces[2].region_header));
  for (auto change : std::vector<void (*)(v1::GradientPiece&)>{
           [](v1::GradientPiece& h) { h.set_step(6); },
           [](v1::GradientPiece& h) { h.set_region(43); },
           [](v1::GradientPiece& h) { h.set_micro_batch(1); },
           [](v1::GradientPiece& h) { h.set_resend(true); },
           [](v1::GradientPiece& h) { h.set_incarnation(98); },
           [](v1::GradientPiece& h) { h.set_region_lent(true); }}) {
    v1::GradientPiece other = *pieces[1].region_header;
    change(other);
    EXPECT_FALSE(SameRegionMessage(*pieces[0].region_header, other));
  }
  v1::GradientPiece no_region = *pieces[1].region_header;
  no_region.set_region(0);
  EXPECT_FALSE(SameRegionMessage(no_region, no_region));

  v1::GradientPiece parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(EncodeRegionPieces(pieces).buffer)));
  v1::GradientPiece first = *pieces[0].region_header;
  EXPECT_EQ(parsed.job(), first.job());
  EXPECT_EQ(parsed.region_offset(), 0);
  EXPECT_EQ(parsed.region_ack(), 1u);
  ASSERT_EQ(parsed.more_ranges_size(), 2);
  for (int k = 1; k < 3; ++k) {
    const v1::RegionRange& r = parsed.more_ranges(k - 1);
    EXPECT_EQ(r.chunk(), k);
    EXPECT_EQ(r.offset(), 10 * k);
    EXPECT_EQ(r.region_offset(), 1000 * k);
    EXPECT_EQ(r.region_bytes(), 64 + k);
    EXPECT_EQ(r.region_ack_offset(), 64);
    EXPECT_EQ(r.region_ack(), static_cast<uint32_t>(k + 1));
  }
}

}  // namespace
}  // namespace zo::client_internal
