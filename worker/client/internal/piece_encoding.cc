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
  piece.region_header = header;
  return piece;
}

bool SameRegionMessage(const v1::GradientPiece& a, const v1::GradientPiece& b) {
  return a.region() != 0 && a.region() == b.region() && a.job() == b.job() &&
         a.step() == b.step() && a.dp_rank() == b.dp_rank() && a.dtype() == b.dtype() &&
         a.resend() == b.resend() && a.incarnation() == b.incarnation() &&
         a.micro_batch() == b.micro_batch() && a.region_lent() == b.region_lent() &&
         a.more_ranges().empty() && b.more_ranges().empty();
}

EncodedPiece EncodeRegionPieces(const std::vector<EncodedPiece>& pieces) {
  v1::GradientPiece header = *pieces.front().region_header;
  for (size_t k = 1; k < pieces.size(); ++k) {
    const v1::GradientPiece& p = *pieces[k].region_header;
    v1::RegionRange* r = header.add_more_ranges();
    r->set_chunk(p.chunk());
    r->set_offset(p.offset());
    r->set_region_offset(p.region_offset());
    r->set_region_bytes(p.region_bytes());
    r->set_region_ack_offset(p.region_ack_offset());
    r->set_region_ack(p.region_ack());
  }
  return EncodeRegionPiece(header);
}

}  // namespace zo::client_internal
