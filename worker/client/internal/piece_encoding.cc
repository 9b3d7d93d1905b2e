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
                                 size_t size, std::shared_ptr<const void> owner) {
  const std::string head = header.SerializeAsString();
  uint8_t prefix[11];
  prefix[0] = kDataTag;
  const size_t prefix_len = 1 + PutVarint(size, prefix + 1);
  const size_t copied = owner == nullptr ? size : 0;
  grpc_slice slice = grpc_slice_malloc(head.size() + prefix_len + copied);
  uint8_t* out = GRPC_SLICE_START_PTR(slice);
  std::memcpy(out, head.data(), head.size());
  std::memcpy(out + head.size(), prefix, prefix_len);
  if (copied > 0) std::memcpy(out + head.size() + prefix_len, data, copied);
  grpc::Slice slices[2] = {grpc::Slice(slice, grpc::Slice::STEAL_REF), grpc::Slice()};
  size_t count = 1;
  if (owner != nullptr && size > 0) {
    // gRPC only reads the payload; the slice API wants a non-const pointer.
    slices[1] = grpc::Slice(
        const_cast<std::byte*>(data), size,
        [](void* held) { delete static_cast<std::shared_ptr<const void>*>(held); },
        new std::shared_ptr<const void>(std::move(owner)));
    count = 2;
  }
  EncodedPiece piece;
  piece.buffer = grpc::ByteBuffer(slices, count);
  piece.payload_bytes = static_cast<int64_t>(size);
  piece.resend = header.resend();
  return piece;
}

}  // namespace zo::client_internal
