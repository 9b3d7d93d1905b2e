// A GradientPiece serialised straight from the caller's gradient bytes into
// the one buffer gRPC sends: one copy on the client instead of two (into the
// message's `bytes` field, then into gRPC's slice). The bytes on the wire are
// an ordinary GradientPiece: the header fields, then `data` (field 7), which
// protobuf accepts in any order.
#ifndef ZO_WORKER_CLIENT_INTERNAL_PIECE_ENCODING_H_
#define ZO_WORKER_CLIENT_INTERNAL_PIECE_ENCODING_H_

#include <cstddef>
#include <cstdint>

#include "grpcpp/support/byte_buffer.h"
#include "proto/zo/v1/gradients.pb.h"

namespace zo::client_internal {

struct EncodedPiece {
  grpc::ByteBuffer buffer;
  int64_t payload_bytes = 0;  // what the piece counts against bytes in flight
  bool resend = false;
};

// `header` has every field but `data`.
EncodedPiece EncodeGradientPiece(const v1::GradientPiece& header, const std::byte* data,
                                 size_t size);

}  // namespace zo::client_internal

#endif  // ZO_WORKER_CLIENT_INTERNAL_PIECE_ENCODING_H_
