// A ParamPiece as the bytes gRPC sends, with its weights not copied
// (rpc/payload_message.h): the data is a slice over the version's own
// memory that keeps `holder` (what keeps that memory held) alive until the
// transport has written it and lets go, which may be after the call's last
// callback. A pull thus writes each weight byte once, to the socket.
#ifndef ZO_SERVER_PARAM_PIECE_WIRE_H_
#define ZO_SERVER_PARAM_PIECE_WIRE_H_

#include <memory>

#include "grpcpp/support/byte_buffer.h"
#include "server/pull_cursor.h"

namespace zo {

grpc::ByteBuffer EncodeParamPiece(const PullPiece& piece, std::shared_ptr<const void> holder);

}  // namespace zo

#endif  // ZO_SERVER_PARAM_PIECE_WIRE_H_
