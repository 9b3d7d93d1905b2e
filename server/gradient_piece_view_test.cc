#include "server/gradient_piece_view.h"

#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/convert.h"
#include "common/fp16.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/optimizer_kernels.h"

namespace zo {
namespace {

using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

// `bytes` cut at random points into slices, as gRPC may hand them over.
grpc::ByteBuffer Sliced(const std::string& bytes, std::mt19937& rng, int max_cuts) {
  std::vector<size_t> cuts = {0, bytes.size()};
  std::uniform_int_distribution<size_t> at(0, bytes.size());
  for (int i = std::uniform_int_distribution<int>(0, max_cuts)(rng); i > 0; --i) {
    cuts.push_back(at(rng));
  }
  std::sort(cuts.begin(), cuts.end());
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    slices.emplace_back(bytes.data() + cuts[i], cuts[i + 1] - cuts[i]);  // empty ones too
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Joined(const GradientPieceView& view) {
  std::string out;
  for (const auto& s : view.data) out.append(s.data(), s.size());
  return out;
}

using Parser = absl::Status (*)(const grpc::ByteBuffer&, std::vector<grpc::Slice>*,
                                GradientPieceView*);

TEST(GradientPieceViewTest, ParsesWhatProtobufSerialisesHoweverItIsSliced) {
  const Parser parse = &ParseGradientPiece;
  std::mt19937 rng(5);
  for (int round = 0; round < 200; ++round) {
    v1::GradientPiece piece;
    piece.set_job("job-" + std::to_string(round));
    piece.set_step(rng() % 1000000 + 1);
    piece.set_dp_rank(round % 3 == 0 ? -1 : static_cast<int>(rng() % 64));
    piece.set_chunk(rng() % 5000);
    piece.set_offset(rng() % 100000);
    piece.set_dtype(round % 2 ? v1::DTYPE_FP16 : v1::DTYPE_BF16);
    piece.set_resend(round % 5 == 0);
    piece.set_micro_batch(round % 7 == 0 ? -2 : static_cast<int>(rng() % 16));
    // Split across slices too: 8 bytes in the middle of the message.
    if (round % 4 != 0)
      piece.set_incarnation((uint64_t{rng()} << 32) ^ rng() ^ (uint64_t{1} << 63));
    if (round % 3 == 1) {  // the same-host route's header fields
      piece.set_region((uint64_t{rng()} << 32) ^ rng());
      piece.set_region_offset(rng() % 100000);
      piece.set_region_bytes(rng() % 100000);
      piece.set_region_ack_offset(8 * (rng() % 512));
      piece.set_region_ack(static_cast<uint32_t>(rng()));
      piece.set_region_lent(rng() % 2 == 0);
      for (int k = static_cast<int>(rng() % 4); k > 0; --k) {
        v1::RegionRange* r = piece.add_more_ranges();
        r->set_chunk(rng() % 5000);
        r->set_offset(rng() % 100000);
        r->set_region_offset(rng() % 100000);
        r->set_region_bytes(rng() % 100000);
        r->set_region_ack_offset(8 * (rng() % 512));
        r->set_region_ack(static_cast<uint32_t>(rng()));
      }
    }
    std::string data(rng() % 5000, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    piece.set_data(data);
    const grpc::ByteBuffer buffer = Sliced(piece.SerializeAsString(), rng, 8);

    std::vector<grpc::Slice> slices;
    GradientPieceView view;
    ASSERT_THAT(parse(buffer, &slices, &view), IsOk());
    EXPECT_EQ(view.job, piece.job());
    EXPECT_EQ(view.step, piece.step());
    EXPECT_EQ(view.dp_rank, piece.dp_rank());
    EXPECT_EQ(view.chunk, piece.chunk());
    EXPECT_EQ(view.offset, piece.offset());
    EXPECT_EQ(view.dtype, piece.dtype());
    EXPECT_EQ(view.resend, piece.resend());
    EXPECT_EQ(view.incarnation, piece.incarnation());
    EXPECT_EQ(view.micro_batch, piece.micro_batch());
    EXPECT_EQ(view.region, piece.region());
    EXPECT_EQ(view.region_offset, piece.region_offset());
    EXPECT_EQ(view.region_bytes, piece.region_bytes());
    EXPECT_EQ(view.region_ack_offset, piece.region_ack_offset());
    EXPECT_EQ(view.region_ack, piece.region_ack());
    EXPECT_EQ(view.region_lent, piece.region_lent());
    EXPECT_EQ(view.data_bytes, data.size());
    EXPECT_EQ(Joined(view), data);
    ASSERT_EQ(view.more_ranges.size(), static_cast<size_t>(piece.more_ranges_size()));
    for (int k = 0; k < piece.more_ranges_size(); ++k) {
      const v1::RegionRange& r = piece.more_ranges(k);
      EXPECT_EQ(view.more_ranges[k], (RegionRangeView{.chunk = r.chunk(),
                                                      .offset = r.offset(),
                                                      .region_offset = r.region_offset(),
                                                      .region_bytes = r.region_bytes(),
                                                      .region_ack_offset = r.region_ack_offset(),
                                                      .region_ack = r.region_ack()}));
      const GradientPieceView one = view.Range(k);
      EXPECT_EQ(one.chunk, r.chunk());
      EXPECT_EQ(one.region_offset, r.region_offset());
      EXPECT_EQ(one.region_ack, r.region_ack());
      EXPECT_EQ(one.region_lent, piece.region_lent()) << "the header's, for every range";
      EXPECT_EQ(one.step, piece.step());
      EXPECT_EQ(one.region, piece.region());
      EXPECT_EQ(one.incarnation, piece.incarnation());
      EXPECT_TRUE(one.more_ranges.empty());
    }
  }
}

TEST(GradientPieceViewTest, MalformedOrTooManyMoreRangesAreRejected) {
  std::mt19937 rng(2);
  std::vector<grpc::Slice> slices;
  GradientPieceView view;
  auto parse = [&](const std::string& bytes) {
    return ParseGradientPiece(Sliced(bytes, rng, 3), &slices, &view);
  };
  v1::GradientPiece piece;
  piece.set_job("job");
  piece.set_region(9);
  piece.add_more_ranges()->set_region_bytes(256);
  const std::string good = piece.SerializeAsString();
  ASSERT_THAT(parse(good), IsOk());
  // An entry whose length runs past the message, and one that ends inside a
  // varint of its own.
  EXPECT_THAT(parse(good.substr(0, good.size() - 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("malformed")));
  std::string overrun = good;
  overrun[overrun.size() - 4] = 2;  // the entry's length, 3 -> 2: its varint is cut
  EXPECT_THAT(parse(overrun),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("malformed")));
  // A field of another wire type inside an entry.
  std::string nested = good.substr(0, good.size() - 6);  // without the entry
  nested += std::string("\x82\x01\x03\x0a\x01x", 6);
  EXPECT_THAT(parse(nested),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("not a varint")));
  v1::GradientPiece many = piece;
  for (size_t k = 0; k < kMaxMoreRanges; ++k) many.add_more_ranges();
  EXPECT_THAT(parse(many.SerializeAsString()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("too many")));
}

TEST(GradientPieceViewTest, TruncatedOrGarbageBytesAreRejected) {
  const Parser parse = &ParseGradientPiece;
  v1::GradientPiece piece;
  piece.set_job("job");
  piece.set_step(3);
  piece.set_data(std::string(300, 'x'));
  const std::string bytes = piece.SerializeAsString();
  std::mt19937 rng(1);
  std::vector<grpc::Slice> slices;
  GradientPieceView view;
  for (size_t cut : {size_t{1}, size_t{4}, bytes.size() - 1}) {  // inside a field
    const grpc::ByteBuffer buffer = Sliced(bytes.substr(0, cut), rng, 2);
    EXPECT_THAT(parse(buffer, &slices, &view),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("malformed")))
        << cut;
  }
  const grpc::ByteBuffer garbage = Sliced(std::string("\x0f\xff\xff", 3), rng, 0);  // wire type 7
  EXPECT_THAT(parse(garbage, &slices, &view),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

// Fields this server does not know (a newer client's), of every wire type,
// and a repeated `data` (the last wins) read as protobuf reads them.
TEST(GradientPieceViewTest, SkipsUnknownFieldsAndKeepsTheLastDataAsProtobufDoes) {
  const Parser parse = &ParseGradientPiece;
  v1::GradientPiece first;
  first.set_data(std::string(2000, 'a'));
  v1::GradientPiece second;
  second.set_job("job");
  second.set_step(7);
  second.set_chunk(300);
  second.set_data(std::string(3000, 'b'));
  const std::string unknown = std::string("\xa0\x01\x96\x01", 4)  // field 20, varint 150
                              + std::string("\xa9\x01", 2) + std::string(8, 'x')  // 21, fixed64
                              + std::string("\xb5\x01", 2) + std::string(4, 'y')  // 22, fixed32
                              + std::string("\xba\x01\x90\x03", 4) + std::string(400, 'z');  // 23
  const std::string bytes =
      unknown + first.SerializeAsString() + unknown + second.SerializeAsString() + unknown;
  v1::GradientPiece want;
  ASSERT_TRUE(want.ParseFromString(bytes));
  std::mt19937 rng(3);
  for (int round = 0; round < 100; ++round) {
    std::vector<grpc::Slice> slices;
    GradientPieceView view;
    ASSERT_THAT(parse(Sliced(bytes, rng, 10), &slices, &view), IsOk());
    EXPECT_EQ(view.job, want.job());
    EXPECT_EQ(view.step, want.step());
    EXPECT_EQ(view.chunk, want.chunk());
    EXPECT_EQ(Joined(view), want.data());
    EXPECT_EQ(view.data_bytes, want.data().size());
  }
}

TEST(GradientPieceViewTest, RejectsALongJobName) {
  v1::GradientPiece piece;
  piece.set_job(std::string(1025, 'j'));
  std::mt19937 rng(4);
  std::vector<grpc::Slice> slices;
  GradientPieceView view;
  EXPECT_THAT(ParseGradientPiece(Sliced(piece.SerializeAsString(), rng, 3), &slices, &view),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("job name")));
}

// Accumulating from any segmentation, elements split across segments
// included, gives the element-wise sum (or the values, overwriting) computed
// with the scalar conversions.
TEST(GradientPieceViewTest, AccumulateSegmentsAddsOrStoresEveryElement) {
  std::mt19937 rng(9);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    const size_t elem = DTypeSize(dtype);
    const size_t n = 1000;
    std::vector<float> values(n);
    for (float& v : values) v = std::uniform_real_distribution<float>(-4, 4)(rng);
    std::string bytes(n * elem, '\0');
    if (dtype == DType::kFloat16) {
      FloatToHalf(values.data(), reinterpret_cast<uint16_t*>(bytes.data()), n);
    } else if (dtype == DType::kBFloat16) {
      FloatToBf16(values.data(), reinterpret_cast<uint16_t*>(bytes.data()), n);
    } else {
      std::memcpy(bytes.data(), values.data(), bytes.size());
    }
    for (int round = 0; round < 50; ++round) {
      const grpc::ByteBuffer buffer = Sliced(bytes, rng, 12);
      std::vector<grpc::Slice> slices;
      ASSERT_TRUE(buffer.Dump(&slices).ok());
      std::vector<absl::Span<const char>> segments;
      for (const grpc::Slice& s : slices) {
        segments.emplace_back(reinterpret_cast<const char*>(s.begin()), s.size());
      }
      const size_t first = rng() % n;
      const size_t count = rng() % (n - first + 1);
      // Adding (dp ranks summed) and storing (one rank: no read of the old value).
      for (bool overwrite : {false, true}) {
        std::vector<float> got(count, 0.5f), want(count, 0.5f);
        AccumulateSegments(segments, dtype, first, count, got.data(), overwrite);
        const auto* bits = reinterpret_cast<const uint16_t*>(bytes.data());
        for (size_t k = 0; k < count; ++k) {
          const float g = dtype == DType::kFloat16    ? HalfBitsToFloat(bits[first + k])
                          : dtype == DType::kBFloat16 ? Bf16BitsToFloat(bits[first + k])
                                                      : values[first + k];
          want[k] = overwrite ? g : want[k] + g;
        }
        ASSERT_EQ(got, want) << DTypeName(dtype) << " round " << round << " overwrite "
                             << overwrite;
      }
      // Kept as received (one rank, 16-bit): the same bytes, across slices.
      std::string copied(count * elem, '\x7f');
      CopySegments(segments, first * elem, count * elem, copied.data());
      ASSERT_EQ(copied, bytes.substr(first * elem, count * elem))
          << DTypeName(dtype) << " round " << round;
    }
  }
}

// A segment of the in-process route is the caller's whole tensor: copied
// past the cache from any offset, into any destination, the same bytes,
// and nothing beside them written.
TEST(CopySegmentsTest, LargeSegmentsAtAnyOffsetKeepTheirBytes) {
  std::string big(300001, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 131 + 7) % 251);
  const std::string small = "tail";
  const std::vector<absl::Span<const char>> segments = {{big.data(), big.size()},
                                                        {small.data(), small.size()}};
  for (const size_t first : {size_t{0}, size_t{1}, size_t{63}, size_t{4099}}) {
    for (const size_t dst_at : {size_t{0}, size_t{3}, size_t{64}}) {
      const size_t n = big.size() + small.size() - first;
      std::string out(dst_at + n + 5, '\x7f');
      CopySegments(segments, first, n, out.data() + dst_at);
      EXPECT_EQ(out.substr(dst_at, n), (big + small).substr(first)) << first << " " << dst_at;
      EXPECT_EQ(out.substr(0, dst_at), std::string(dst_at, '\x7f'));
      EXPECT_EQ(out.substr(dst_at + n), std::string(5, '\x7f'));
    }
  }
}

}  // namespace
}  // namespace zo
