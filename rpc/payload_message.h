// A message whose bulk `bytes` field goes to gRPC without the copies that
// set_data and serialisation make: the other fields are serialised as
// usual, then the field's tag and length, then the payload. With an
// `owner`, the payload is not copied at all: a slice points at it and holds
// a reference to `owner` until gRPC lets go of it (which may be after the
// call's last callback). The bytes on the wire are an ordinary message:
// protobuf accepts fields in any order.
#ifndef ZO_RPC_PAYLOAD_MESSAGE_H_
#define ZO_RPC_PAYLOAD_MESSAGE_H_

#include <cstddef>
#include <memory>

#include "absl/types/span.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"

namespace zo {

// `header` has every field but `data_field` (a `bytes` field's number).
grpc::ByteBuffer SerializeWithPayload(const google::protobuf::MessageLite& header, int data_field,
                                      absl::Span<const std::byte> data,
                                      std::shared_ptr<const void> owner = nullptr);

}  // namespace zo

#endif  // ZO_RPC_PAYLOAD_MESSAGE_H_
