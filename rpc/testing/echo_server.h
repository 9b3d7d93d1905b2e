// A real gRPC server on a loopback port for the rpc/ tests: GetServerInfo
// echoes what the call carried, OpenJob answers with the request's
// config_json (as status.job), so a large request makes a large answer;
// InitParams counts the pieces it reads, and refuses (INVALID_ARGUMENT, at
// once) a piece of job "refuse".
// The server's own limit is kMaxMessageBytes both ways.
#ifndef ZO_RPC_TESTING_ECHO_SERVER_H_
#define ZO_RPC_TESTING_ECHO_SERVER_H_

#include <chrono>
#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/rpc_util.h"

namespace zo::testing {

class EchoService final : public v1::Offload::Service {
 public:
  // version: the authorization metadata ("" when absent); max_message_bytes:
  // 1 when the call has a deadline, 0 when it has none.
  grpc::Status GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest*,
                             v1::GetServerInfoResponse* response) override {
    const auto& metadata = context->client_metadata();
    auto it = metadata.find(kAuthMetadataKey);
    response->set_version(it == metadata.end() ? ""
                                               : std::string(it->second.data(), it->second.size()));
    response->set_max_message_bytes(
        context->deadline() == std::chrono::system_clock::time_point::max() ? 0 : 1);
    return grpc::Status::OK;
  }

  grpc::Status OpenJob(grpc::ServerContext*, const v1::OpenJobRequest* request,
                       v1::OpenJobResponse* response) override {
    response->mutable_status()->set_job(request->config_json());
    return grpc::Status::OK;
  }

  grpc::Status InitParams(grpc::ServerContext*, grpc::ServerReader<v1::ParamInitPiece>* reader,
                          v1::InitParamsResponse* response) override {
    v1::ParamInitPiece piece;
    while (reader->Read(&piece)) {
      if (piece.job() == "refuse") {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "refused piece");
      }
      response->set_pieces(response->pieces() + 1);
    }
    return grpc::Status::OK;
  }
};

class EchoServer {
 public:
  EchoServer() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
    builder.SetMaxSendMessageSize(kMaxMessageBytes);
    server_ = builder.BuildAndStart();
  }
  ~EchoServer() { server_->Shutdown(); }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  EchoService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace zo::testing

#endif  // ZO_RPC_TESTING_ECHO_SERVER_H_
