#include "worker/client/internal/pull_receiver.h"

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo::client_internal {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

// Tensors a (10 elements) and b (6), chunks of 4, two servers:
//   chunk 0 [0,4)  a[0,4)   server 0
//   chunk 1 [4,8)  a[4,8)   server 1
//   chunk 2 [8,12) a[8,10) b[0,2)  server 0
//   chunk 3 [12,16) b[2,6)  server 1
class PullReceiverTest : public ::testing::Test {
 protected:
  PullReceiverTest()
      : map_(*ShardMap::Create({{.name = "a", .shape = {10}}, {.name = "b", .shape = {6}}}, 4, 2)),
        a_(20, std::byte{0}),
        b_(12, std::byte{0}),
        dst_{absl::Span<std::byte>(a_), absl::Span<std::byte>(b_)} {}

  PullReceiver Receiver(int server, int64_t have_version = -1) {
    return PullReceiver(map_, DType::kFloat16, server, /*version=*/5, have_version, tensors_, dst_);
  }

  static v1::ParamPiece Piece(int tensor, int64_t offset, int64_t elems, char fill) {
    v1::ParamPiece p;
    p.set_tensor(tensor);
    p.set_offset(offset);
    p.set_dtype(v1::DTYPE_FP16);
    p.set_data(std::string(static_cast<size_t>(elems * 2), fill));
    p.set_version(5);
    p.set_loss_scale(1024);
    return p;
  }

  ShardMap map_;
  std::vector<std::byte> a_;
  std::vector<std::byte> b_;
  const std::vector<int> tensors_ = {0, 1};
  std::vector<absl::Span<std::byte>> dst_;
};

TEST_F(PullReceiverTest, PlacesWhatEachServerOwns) {
  PullReceiver s0 = Receiver(0);
  PullReceiver s1 = Receiver(1);
  EXPECT_THAT(s0.tensors(), ::testing::ElementsAre(0, 1));
  ASSERT_THAT(s0.Accept(Piece(0, 0, 4, 'x')), IsOk());
  ASSERT_THAT(s0.Accept(Piece(0, 8, 2, 'y')), IsOk());
  ASSERT_THAT(s0.Accept(Piece(1, 0, 2, 'z')), IsOk());
  ASSERT_THAT(s1.Accept(Piece(1, 2, 4, 'w')), IsOk());
  ASSERT_THAT(s1.Accept(Piece(0, 6, 2, 'v')), IsOk());  // any order, any split
  ASSERT_THAT(s1.Accept(Piece(0, 4, 2, 'u')), IsOk());
  EXPECT_THAT(s0.Finish(), IsOk());
  EXPECT_THAT(s1.Finish(), IsOk());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(a_.data()), a_.size()),
            "xxxxxxxxuuuuvvvvyyyy");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b_.data()), b_.size()), "zzzzwwwwwwww");
  EXPECT_EQ(s0.loss_scale(), 1024);
  EXPECT_FALSE(s0.unchanged());
}

// A piece pulled into the region may describe more pieces (more_ranges):
// each is placed from where its range says, and one range outside the
// weights area fails the pull, naming it.
TEST_F(PullReceiverTest, PlacesEachOfAPiecesMoreRangesFromTheRegion) {
  // Server 0's elements in its local order: a[0,4), a[8,10), b[0,2).
  const std::string area = "xxxxxxxxyyyyzzzz";
  const auto bytes = absl::MakeConstSpan(reinterpret_cast<const std::byte*>(area.data()), 16);
  auto in_region = [](int tensor, int64_t offset, int64_t at, int64_t n) {
    v1::ParamRange r;
    r.set_tensor(tensor);
    r.set_offset(offset);
    r.set_region_offset(1000 + at);
    r.set_region_bytes(n);
    return r;
  };
  v1::ParamPiece piece = Piece(0, 0, 4, 'x');
  piece.clear_data();
  piece.set_region_offset(1000);
  piece.set_region_bytes(8);
  *piece.add_more_ranges() = in_region(0, 8, 8, 4);
  *piece.add_more_ranges() = in_region(1, 0, 12, 4);
  PullReceiver s0 = Receiver(0);
  ASSERT_THAT(s0.AcceptFromRegion(piece, bytes, 1000), IsOk());
  EXPECT_THAT(s0.Finish(), IsOk());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(a_.data()), 8), "xxxxxxxx");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(a_.data()) + 16, 4), "yyyy");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b_.data()), 4), "zzzz");

  *piece.mutable_more_ranges(1) = in_region(1, 0, 14, 4);  // runs past the area's end
  PullReceiver again = Receiver(0);
  EXPECT_THAT(again.AcceptFromRegion(piece, bytes, 1000),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("outside the shared region")));
  v1::ParamPiece unchanged;
  unchanged.set_version(5);
  unchanged.set_unchanged(true);
  unchanged.set_loss_scale(1);
  *unchanged.add_more_ranges() = in_region(0, 0, 0, 8);
  PullReceiver third = Receiver(0, 4);
  EXPECT_THAT(third.AcceptFromRegion(unchanged, bytes, 1000),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("unchanged")));
}

// Server 0's own chunks are 0 (local 0) and 2 (local 1): a pull of stripe
// 1 of 2 takes chunk 2's elements alone, and a piece of chunk 0 is another
// stripe's.
TEST_F(PullReceiverTest, AStripeTakesOnlyItsChunks) {
  PullReceiver stripe1(map_, DType::kFloat16, 0, /*version=*/5, -1, tensors_, dst_,
                       PullStripe{.stripe = 1, .stripes = 2});
  EXPECT_THAT(stripe1.tensors(), ::testing::ElementsAre(0, 1));
  EXPECT_THAT(stripe1.Accept(Piece(0, 0, 4, 'x')),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("tensor #0 'a'")));
  ASSERT_THAT(stripe1.Accept(Piece(0, 8, 2, 'y')), IsOk());
  EXPECT_THAT(stripe1.Finish(), StatusIs(absl::StatusCode::kDataLoss, ::testing::_));
  ASSERT_THAT(stripe1.Accept(Piece(1, 0, 2, 'z')), IsOk());
  EXPECT_THAT(stripe1.Finish(), IsOk());
  // Stripe 0 of 2 owns chunk 0 only, which holds nothing of b.
  PullReceiver stripe0(map_, DType::kFloat16, 0, /*version=*/5, -1, tensors_, dst_,
                       PullStripe{.stripe = 0, .stripes = 2});
  EXPECT_THAT(stripe0.tensors(), ::testing::ElementsAre(0));
  // A stripe with no chunk of the server (its third of three) asks nothing.
  PullReceiver none(map_, DType::kFloat16, 0, /*version=*/5, -1, tensors_, dst_,
                    PullStripe{.stripe = 2, .stripes = 3});
  EXPECT_TRUE(none.tensors().empty());
}

TEST_F(PullReceiverTest, RejectsElementsOwnedByAnotherServer) {
  PullReceiver s0 = Receiver(0);
  EXPECT_THAT(s0.Accept(Piece(0, 4, 1, 'x')),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("tensor #0 'a'")));
  EXPECT_THAT(s0.Accept(Piece(0, 2, 4, 'x')),  // runs from its chunk into the next
              StatusIs(absl::StatusCode::kInternal, HasSubstr("not all among the ones it owns")));
  EXPECT_EQ(a_[2], std::byte{0});  // nothing copied
}

TEST_F(PullReceiverTest, RejectsOutOfBoundsPieces) {
  PullReceiver s0 = Receiver(0);
  EXPECT_THAT(s0.Accept(Piece(0, -1, 1, 'x')),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("offset -1")));
  EXPECT_THAT(s0.Accept(Piece(0, 8, 3, 'x')),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("offset 8")));
  EXPECT_THAT(s0.Accept(Piece(0, std::numeric_limits<int64_t>::max() - 1, 2, 'x')),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("not all among")));
  EXPECT_THAT(s0.Accept(Piece(7, 0, 1, 'x')),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("tensor #7")));
  v1::ParamPiece odd = Piece(0, 0, 1, 'x');
  odd.set_data("abc");
  EXPECT_THAT(s0.Accept(odd), StatusIs(absl::StatusCode::kInternal, HasSubstr("3 bytes")));
}

TEST_F(PullReceiverTest, RejectsTensorsNotAsked) {
  const std::vector<int> only_a = {0};
  PullReceiver s1(map_, DType::kFloat16, 1, 5, -1, only_a, absl::MakeSpan(dst_).subspan(0, 1));
  EXPECT_THAT(s1.tensors(), ::testing::ElementsAre(0));
  EXPECT_THAT(s1.Accept(Piece(1, 2, 4, 'x')),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("not asked")));
}

TEST_F(PullReceiverTest, RejectsWrongDtypeVersionAndLossScale) {
  PullReceiver s0 = Receiver(0);
  v1::ParamPiece p = Piece(0, 0, 4, 'x');
  p.set_dtype(v1::DTYPE_BF16);
  EXPECT_THAT(s0.Accept(p), StatusIs(absl::StatusCode::kInternal, HasSubstr("DTYPE_BF16")));
  p = Piece(0, 0, 4, 'x');
  p.set_version(4);
  EXPECT_THAT(s0.Accept(p), StatusIs(absl::StatusCode::kInternal, HasSubstr("version 4")));
  p = Piece(0, 0, 4, 'x');
  p.set_loss_scale(0);
  EXPECT_THAT(s0.Accept(p), StatusIs(absl::StatusCode::kInternal, HasSubstr("loss scale 0")));
}

TEST_F(PullReceiverTest, MissingOrDuplicateElementsAreDataLoss) {
  PullReceiver s0 = Receiver(0);
  ASSERT_THAT(s0.Accept(Piece(0, 0, 4, 'x')), IsOk());
  ASSERT_THAT(s0.Accept(Piece(1, 0, 2, 'x')), IsOk());
  EXPECT_THAT(s0.Finish(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("4 of the 6 elements of tensor #0")));
  ASSERT_THAT(s0.Accept(Piece(0, 8, 2, 'x')), IsOk());
  ASSERT_THAT(s0.Accept(Piece(0, 1, 2, 'x')), IsOk());
  EXPECT_THAT(s0.Finish(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("[1, 3)")));

  s0.Reset();  // a retried call starts over
  ASSERT_THAT(s0.Accept(Piece(0, 0, 4, 'x')), IsOk());
  ASSERT_THAT(s0.Accept(Piece(0, 8, 2, 'x')), IsOk());
  ASSERT_THAT(s0.Accept(Piece(1, 0, 2, 'x')), IsOk());
  EXPECT_THAT(s0.Finish(), IsOk());
}

TEST_F(PullReceiverTest, UnchangedMustBeTheOnlyPiece) {
  v1::ParamPiece unchanged;
  unchanged.set_unchanged(true);
  unchanged.set_version(5);
  unchanged.set_loss_scale(512);

  PullReceiver fresh = Receiver(0, /*have_version=*/-1);
  EXPECT_THAT(fresh.Accept(unchanged),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("holds none")));

  PullReceiver s0 = Receiver(0, /*have_version=*/4);
  ASSERT_THAT(s0.Accept(unchanged), IsOk());
  EXPECT_TRUE(s0.unchanged());
  EXPECT_EQ(s0.loss_scale(), 512);
  EXPECT_THAT(s0.Finish(), IsOk());
  EXPECT_THAT(s0.Accept(Piece(0, 0, 4, 'x')),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("unchanged")));

  PullReceiver s1 = Receiver(1, /*have_version=*/4);
  ASSERT_THAT(s1.Accept(Piece(0, 4, 4, 'x')), IsOk());
  EXPECT_THAT(s1.Accept(unchanged),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("after sending")));
}

}  // namespace
}  // namespace zo::client_internal
