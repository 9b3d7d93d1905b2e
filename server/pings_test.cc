// A client's pings against zo-server over a real socket (rpc/pings.h): a call
// that waits long on a live server keeps its connection however many pings
// it sends meanwhile, because the server accepts them.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "rpc/channel.h"
#include "rpc/rpc_util.h"
#include "server/offload_server.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using testing::StatusIs;

constexpr int kElems = 16;
// gRPC sends keepalive pings at most once a second, whatever is asked.
constexpr absl::Duration kClientPings = absl::Seconds(1);

std::unique_ptr<grpc::ClientContext> Context(std::chrono::milliseconds timeout) {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(std::chrono::system_clock::now() + timeout);
  return c;
}

// A one-tensor job on the server at `address` with version 0 of its weights.
absl::Status OpenJobAtVersionZero(v1::Offload::Stub& stub, const std::string& address) {
  v1::OpenJobRequest open;
  open.set_job("pings");
  v1::TensorSpec* t = open.mutable_manifest()->add_tensors();
  t->set_name("w");
  t->add_shape(kElems);
  t->set_dtype(v1::DTYPE_FP32);
  open.set_config_json(R"({"train_micro_batch_size_per_gpu": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})");
  open.set_dp_world_size(1);
  open.add_servers(address);
  v1::OpenJobResponse opened;
  absl::Status s =
      FromGrpcStatus(stub.OpenJob(Context(std::chrono::seconds(60)).get(), open, &opened));
  if (!s.ok()) return s;
  v1::InitParamsResponse inited;
  auto context = Context(std::chrono::seconds(60));
  auto writer = stub.InitParams(context.get(), &inited);
  v1::ParamInitPiece piece;
  piece.set_job("pings");
  piece.set_chunk(0);
  const std::vector<float> w(kElems, 1.0f);
  piece.set_data(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(float));
  writer->Write(piece);
  writer->WritesDone();
  return FromGrpcStatus(writer->Finish());
}

// A pull of version 1, which no step makes: it waits on the server until
// `timeout`, the client pinging all along.
absl::Status WaitInAPull(v1::Offload::Stub& stub, std::chrono::milliseconds timeout) {
  v1::PullParamsRequest r;
  r.set_job("pings");
  r.set_version(1);
  r.set_have_version(-1);
  auto context = Context(timeout);
  auto reader = stub.PullParams(context.get(), r);
  v1::ParamPiece piece;
  while (reader->Read(&piece)) {
  }
  return FromGrpcStatus(reader->Finish());
}

// The wait of a client pinging every second on a server that accepts pings
// every `accepted`: how it ended.
absl::Status LongWait(absl::Duration accepted, std::chrono::milliseconds wait) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.threads = 1;
  options.accept_pings_every = accepted;
  absl::StatusOr<std::unique_ptr<OffloadServer>> server = OffloadServer::Start(options);
  if (!server.ok()) return server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      NewChannel(address, {.ping_every = kClientPings});
  if (!channel.ok()) return channel.status();
  std::unique_ptr<v1::Offload::Stub> stub = v1::Offload::NewStub(*channel);
  absl::Status opened = OpenJobAtVersionZero(*stub, address);
  if (!opened.ok()) return opened;
  const absl::Status waited = WaitInAPull(*stub, wait);
  (*server)->Shutdown(absl::ZeroDuration());
  return waited;
}

TEST(PingsTest, AWaitOfManyPingsOnAServerThatAcceptsThemEndsByItsDeadline) {
  // Eight pings without data between them; with gRPC's default acceptance
  // the wait ends after about five (below).
  EXPECT_THAT(LongWait(kClientPings / 2, std::chrono::seconds(8)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
}

// The same wait against gRPC's default acceptance (a ping per 5 minutes,
// two strikes): the pings are really sent, and without the server's
// acceptance they would end every long wait of a worker.
TEST(PingsTest, ServerThatDoesNotAcceptThePingsEndsTheWaitWithGoaway) {
  EXPECT_THAT(LongWait(absl::Minutes(5), std::chrono::seconds(30)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("many pings")));
}

}  // namespace
}  // namespace zo
