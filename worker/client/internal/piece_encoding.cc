#include "worker/client/internal/piece_encoding.h"

#include <string>
#include <utility>

#include "rpc/payload_message.h"

namespace zo::client_internal {

EncodedPiece EncodeGradientPiece(const v1::GradientPiece& header, const std::byte* data,
                                 size_t size, std::shared_ptr<const void> owner) {
  EncodedPiece piece;
  piece.buffer = SerializeWithPayload(header, v1::GradientPiece::kDataFieldNumber, {data, size},
                                      std::move(owner));
  piece.payload_bytes = static_cast<int64_t>(size);
  piece.resend = header.resend();
  return piece;
}

EncodedPiece EncodeRegionPiece(const v1::GradientPiece& header) {
  const std::string bytes = header.SerializeAsString();
  grpc::Slice slice(bytes);
  EncodedPiece piece;
  piece.buffer = grpc::ByteBuffer(&slice, 1);
  piece.payload_bytes = 0;
  piece.resend = header.resend();
  return piece;
}

}  // namespace zo::client_internal
