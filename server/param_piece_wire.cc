#include "server/param_piece_wire.h"

#include <utility>

#include "rpc/payload_message.h"

namespace zo {

grpc::ByteBuffer EncodeParamPiece(const PullPiece& piece, std::shared_ptr<const void> holder) {
  return SerializeWithPayload(ParamPieceHeader(piece), v1::ParamPiece::kDataFieldNumber, piece.data,
                              std::move(holder));
}

}  // namespace zo
