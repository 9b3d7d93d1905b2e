#include "rpc/payload_message.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "grpcpp/support/slice.h"

namespace zo {
namespace {

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

grpc::ByteBuffer SerializeWithPayload(const google::protobuf::MessageLite& header, int data_field,
                                      absl::Span<const std::byte> data,
                                      std::shared_ptr<const void> owner) {
  const std::string head = header.SerializeAsString();
  uint8_t prefix[20];
  size_t prefix_len = 0;
  if (!data.empty()) {
    prefix_len =
        PutVarint((static_cast<uint64_t>(data_field) << 3) | 2, prefix);  // length-delimited
    prefix_len += PutVarint(data.size(), prefix + prefix_len);
  }
  const size_t copied = owner == nullptr ? data.size() : 0;
  grpc_slice slice = grpc_slice_malloc(head.size() + prefix_len + copied);
  uint8_t* out = GRPC_SLICE_START_PTR(slice);
  std::memcpy(out, head.data(), head.size());
  std::memcpy(out + head.size(), prefix, prefix_len);
  if (copied > 0) std::memcpy(out + head.size() + prefix_len, data.data(), copied);
  grpc::Slice slices[2] = {grpc::Slice(slice, grpc::Slice::STEAL_REF), grpc::Slice()};
  size_t count = 1;
  if (owner != nullptr && !data.empty()) {
    // gRPC only reads the payload; the slice API wants a non-const pointer.
    slices[1] = grpc::Slice(
        const_cast<std::byte*>(data.data()), data.size(),
        [](void* held) { delete static_cast<std::shared_ptr<const void>*>(held); },
        new std::shared_ptr<const void>(std::move(owner)));
    count = 2;
  }
  return grpc::ByteBuffer(slices, count);
}

}  // namespace zo
