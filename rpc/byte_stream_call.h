// A client-streaming call whose messages are serialized already (the
// worker's gradient pieces, piece_encoding.h; tests that send raw bytes):
// the generic stub's callback reactor behind a blocking facade, for one
// thread that writes the messages one after another. Public gRPC API only;
// on the wire a generic call is the generated client-streaming one (the
// messages, then the single response).
//
//   ByteStreamCall call(channel, context.get(), "/zo.v1.Offload/PushGradients");
//   for (const grpc::ByteBuffer& m : messages) if (!call.Write(m)) break;
//   grpc::Status s = call.Finish(&response);
#ifndef ZO_RPC_BYTE_STREAM_CALL_H_
#define ZO_RPC_BYTE_STREAM_CALL_H_

#include <memory>
#include <string>

#include "google/protobuf/message_lite.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/status.h"

namespace zo {

// Not thread-safe: one writer. `context` (deadline, token; TryCancel from
// any thread ends the call) must outlive the call.
class ByteStreamCall {
 public:
  ByteStreamCall(const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* context,
                 const std::string& method);
  // Finishes the call if Finish was not called (half-closes and waits).
  ~ByteStreamCall();
  ByteStreamCall(const ByteStreamCall&) = delete;
  ByteStreamCall& operator=(const ByteStreamCall&) = delete;

  // Blocks until gRPC has taken `message` (flow control allowing); false
  // once the call has ended, and for every Write after that (Finish says
  // why).
  bool Write(const grpc::ByteBuffer& message);

  // Half-closes (unless a Write failed) and waits for the end; parses the
  // response into `response` when the call ended OK. Once.
  grpc::Status Finish(google::protobuf::MessageLite* response);

 private:
  class Reactor;
  std::unique_ptr<Reactor> reactor_;
  bool broken_ = false;
  bool finished_ = false;
};

}  // namespace zo

#endif  // ZO_RPC_BYTE_STREAM_CALL_H_
