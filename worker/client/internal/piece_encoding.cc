#include "worker/client/internal/piece_encoding.h"

#include <cstring>
#include <string>

#include "grpcpp/support/slice.h"

namespace zo::client_internal {
namespace {

constexpr uint8_t kDataTag = (v1::GradientPiece::kDataFieldNumber << 3) | 2;  // length-delimited

size_t PutVarint(uint64_t v, uint8_t* out) {
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  out[n++] = static_cast<uint8_t>(v);
  return n;
}

}  // namespace

EncodedPiece EncodeGradientPiece(const v1::GradientPiece& header, const std::byte* data,
                                 size_t size) {
  const std::string head = header.SerializeAsString();
  uint8_t prefix[11];
  prefix[0] = kDataTag;
  const size_t prefix_len = 1 + PutVarint(size, prefix + 1);
  grpc_slice slice = grpc_slice_malloc(head.size() + prefix_len + size);
  uint8_t* out = GRPC_SLICE_START_PTR(slice);
  std::memcpy(out, head.data(), head.size());
  std::memcpy(out + head.size(), prefix, prefix_len);
  if (size > 0) std::memcpy(out + head.size() + prefix_len, data, size);
  grpc::Slice owned(slice, grpc::Slice::STEAL_REF);
  EncodedPiece piece;
  piece.buffer = grpc::ByteBuffer(&owned, 1);
  piece.payload_bytes = static_cast<int64_t>(size);
  piece.resend = header.resend();
  return piece;
}

}  // namespace zo::client_internal
