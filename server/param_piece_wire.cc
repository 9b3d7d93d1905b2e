#include "server/param_piece_wire.h"

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>

#include "grpc/slice.h"
#include "grpcpp/support/slice.h"
#include "rpc/proto_convert.h"

namespace zo {
namespace {

// Protobuf's wire types.
constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLengthDelimited = 2;

void PutVarint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void PutTag(std::string& out, uint32_t field, uint32_t wire_type) {
  PutVarint(out, (field << 3) | wire_type);
}

// proto3 leaves fields at their defaults out, as the generated code does.
void PutVarintField(std::string& out, uint32_t field, int64_t value) {
  if (value == 0) return;
  PutTag(out, field, kVarint);
  PutVarint(out, static_cast<uint64_t>(value));  // negative: ten bytes, as protobuf
}

void DeleteHolder(void* holder) { delete static_cast<std::shared_ptr<const void>*>(holder); }

}  // namespace

grpc::ByteBuffer EncodeParamPiece(const PullPiece& piece, std::shared_ptr<const void> holder) {
  // Fields 1-3 and the data's tag and length; the data; fields 5-7.
  std::string head;
  PutVarintField(head, 1, piece.tensor);
  PutVarintField(head, 2, piece.offset);
  if (!piece.unchanged) PutVarintField(head, 3, DTypeToProto(piece.dtype));
  if (!piece.data.empty()) {
    PutTag(head, 4, kLengthDelimited);
    PutVarint(head, piece.data.size());
  }
  std::string tail;
  PutVarintField(tail, 5, piece.version);
  PutVarintField(tail, 6, piece.unchanged ? 1 : 0);
  if (piece.loss_scale != 0) {
    PutTag(tail, 7, kFixed64);
    char bytes[8];
    static_assert(std::endian::native == std::endian::little, "fixed64 is little-endian");
    std::memcpy(bytes, &piece.loss_scale, 8);
    tail.append(bytes, 8);
  }
  grpc::Slice slices[3];
  size_t n = 0;
  slices[n++] = grpc::Slice(head);
  if (!piece.data.empty()) {
    void* data = const_cast<std::byte*>(piece.data.data());  // gRPC only reads it
    slices[n++] = grpc::Slice(
        grpc_slice_new_with_user_data(data, piece.data.size(), &DeleteHolder,
                                      new std::shared_ptr<const void>(std::move(holder))),
        grpc::Slice::STEAL_REF);
  }
  slices[n++] = grpc::Slice(tail);
  return grpc::ByteBuffer(slices, n);
}

}  // namespace zo
