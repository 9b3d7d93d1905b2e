// A GradientPiece serialised straight from the caller's gradient bytes into
// the buffer gRPC sends: one copy on the client instead of two (into the
// message's `bytes` field, then into gRPC's slice), or none when the caller
// shares ownership of the bytes. The bytes on the wire are
// an ordinary GradientPiece: the header fields, then `data` (field 7), which
// protobuf accepts in any order.
#ifndef ZO_WORKER_CLIENT_INTERNAL_PIECE_ENCODING_H_
#define ZO_WORKER_CLIENT_INTERNAL_PIECE_ENCODING_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "grpcpp/support/byte_buffer.h"
#include "proto/zo/v1/gradients.pb.h"

namespace zo::client_internal {

struct EncodedPiece {
  grpc::ByteBuffer buffer;
  int64_t payload_bytes = 0;  // what the piece counts against bytes in flight
  bool resend = false;
  // A piece in the caller's shared region: its header, which a stream may
  // send as one of a message's more_ranges instead (BatchRegionPieces).
  std::optional<v1::GradientPiece> region_header;
};

// `header` has every field but `data`. With an `owner`, the payload is not
// copied: the buffer's second slice points at `data` and holds a reference
// to `owner` until gRPC lets go of it.
EncodedPiece EncodeGradientPiece(const v1::GradientPiece& header, const std::byte* data,
                                 size_t size, std::shared_ptr<const void> owner = nullptr);

// A piece whose bytes lie in the caller's shared region (`header` names
// where): the header alone, counting nothing against bytes in flight.
EncodedPiece EncodeRegionPiece(const v1::GradientPiece& header);

// Whether region pieces `a` and `b` may travel in one message (all but
// where their bytes lie and their acknowledgement agree).
bool SameRegionMessage(const v1::GradientPiece& a, const v1::GradientPiece& b);

// Region pieces (each region_header set, SameRegionMessage as the first)
// as one message: the first's header with the others as its more_ranges,
// in order (the server delivers them so).
EncodedPiece EncodeRegionPieces(const std::vector<EncodedPiece>& pieces);

}  // namespace zo::client_internal

#endif  // ZO_WORKER_CLIENT_INTERNAL_PIECE_ENCODING_H_
