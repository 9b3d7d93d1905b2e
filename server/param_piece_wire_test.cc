#include "server/param_piece_wire.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "gtest/gtest.h"
#include "proto/zo/v1/params.pb.h"
#include "server/param_versions.h"
#include "server/pull_cursor.h"

namespace zo {
namespace {

// The bytes gRPC would send, parsed the way a client parses them.
v1::ParamPiece Parse(const grpc::ByteBuffer& buffer) {
  grpc::ByteBuffer copy = buffer;  // Deserialize consumes its argument
  v1::ParamPiece piece;
  EXPECT_TRUE(grpc::SerializationTraits<v1::ParamPiece>::Deserialize(&copy, &piece).ok());
  return piece;
}

// Two cursors over the same version: one gives messages (the reference,
// protobuf's own encoding of a copy), the other pieces encoded by hand.
TEST(ParamPieceWireTest, EveryPieceParsesToTheMessageTheCursorBuilds) {
  constexpr int64_t kElems = 3 * (kMaxPullPieceBytes / 2) + 77;  // pieces of 1 MiB and a rest
  auto versions = *ParamVersions::Create(kElems, DType::kBFloat16);
  auto* data = static_cast<uint16_t*>(versions->base_data());
  for (int64_t i = 0; i < kElems; ++i) data[i] = static_cast<uint16_t>(i * 7919);
  const std::vector<PullCursor::Range> ranges = {
      {.tensor = 0, .tensor_offset = 0, .local_offset = 0, .elems = 5},
      {.tensor = 3, .tensor_offset = 1 << 20, .local_offset = 5, .elems = kElems - 5}};
  PullCursor messages =
      PullCursor::Serving(1ll << 40, 65536.0, DType::kBFloat16, *versions->Acquire(0), ranges);
  PullCursor pieces =
      PullCursor::Serving(1ll << 40, 65536.0, DType::kBFloat16, *versions->Acquire(0), ranges);
  v1::ParamPiece expected;
  PullPiece piece;
  int count = 0;
  while (messages.Next(&expected)) {
    ASSERT_TRUE(pieces.Next(&piece));
    const v1::ParamPiece got = Parse(EncodeParamPiece(piece, piece.owner));
    EXPECT_EQ(got.SerializeAsString(), expected.SerializeAsString()) << "piece " << count;
    ++count;
  }
  EXPECT_FALSE(pieces.Next(&piece));
  EXPECT_EQ(count, 5);  // 5 elements, then the rest in 1 MiB pieces
}

TEST(ParamPieceWireTest, AnUnchangedPieceAndDefaultFieldsParseAlike) {
  PullCursor messages = PullCursor::Unchanged(0, 1.0);
  PullCursor pieces = PullCursor::Unchanged(0, 1.0);
  v1::ParamPiece expected;
  PullPiece piece;
  ASSERT_TRUE(messages.Next(&expected));
  ASSERT_TRUE(pieces.Next(&piece));
  const v1::ParamPiece got = Parse(EncodeParamPiece(piece, nullptr));
  EXPECT_TRUE(got.unchanged());
  EXPECT_EQ(got.SerializeAsString(), expected.SerializeAsString());
}

// The data slice holds the version until gRPC lets go of it, even when the
// cursor is gone: a writer waiting for the buffer waits for the bytes sent.
TEST(ParamPieceWireTest, TheDataSliceHoldsTheVersionUntilItIsReleased) {
  auto versions = *ParamVersions::Create(16, DType::kFloat16);
  std::optional<grpc::ByteBuffer> buffer;
  std::weak_ptr<const void> holder;
  {
    PullCursor cursor =
        PullCursor::Serving(0, 1.0, DType::kFloat16, *versions->Acquire(0),
                            {{.tensor = 0, .tensor_offset = 0, .local_offset = 0, .elems = 16}});
    PullPiece piece;
    ASSERT_TRUE(cursor.Next(&piece));
    holder = piece.owner;
    buffer.emplace(EncodeParamPiece(piece, std::move(piece.owner)));
  }
  EXPECT_FALSE(holder.expired());  // the cursor is gone, the slice holds on
  buffer.reset();
  EXPECT_TRUE(holder.expired());
  versions->BeginWrite();  // nobody reads version 0 any more: does not wait
  versions->CommitWrite(1);
}

}  // namespace
}  // namespace zo
