#include "worker/pipeline/tcp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/pipeline/executor.h"
#include "worker/pipeline/in_process_transport.h"
#include "worker/pipeline/internal/tcp_wire.h"
#include "worker/pipeline/testing/toy_stage_module.h"

namespace zo::pipeline {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::zo::pipeline::testing::ToyStageModule;
using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

// A port nothing listens on right now (the kernel's pick for port 0).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

std::vector<std::string> Addresses(int stages) {
  std::vector<std::string> out;
  for (int s = 0; s < stages; ++s) out.push_back(absl::StrCat("127.0.0.1:", FreePort()));
  return out;
}

TcpTransportOptions Options(int stage, const std::vector<std::string>& addresses,
                            std::string job = "job-1") {
  TcpTransportOptions o;
  o.stage = stage;
  o.stages = static_cast<int>(addresses.size());
  o.addresses = addresses;
  o.job = std::move(job);
  o.connect_timeout = absl::Seconds(20);
  o.recv_timeout = absl::Seconds(20);
  return o;
}

// Connects every stage of `addresses` on its own thread.
std::vector<absl::StatusOr<std::unique_ptr<TcpTransport>>> ConnectAll(
    backend::Backend& backend, std::vector<TcpTransportOptions> options) {
  std::vector<absl::StatusOr<std::unique_ptr<TcpTransport>>> out(options.size());
  std::vector<std::thread> threads;
  for (size_t s = 0; s < options.size(); ++s) {
    threads.emplace_back([&, s] { out[s] = TcpTransport::Connect(options[s], backend); });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

backend::Tensor Filled(backend::Backend& backend, DType dtype, backend::Shape shape, int seed) {
  backend::Tensor t = backend.Empty(dtype, shape);
  std::vector<float> values(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<float>(static_cast<int>((i * 7 + seed) % 2001) - 1000) * 0.5f;
  }
  EXPECT_THAT(backend.UploadFloat(values, t), IsOk());
  return t;
}

std::vector<std::byte> Bytes(backend::Backend& backend, const backend::Tensor& t) {
  std::vector<std::byte> out(static_cast<size_t>(t.nbytes()));
  EXPECT_THAT(backend.Download(t, absl::MakeSpan(out)), IsOk());
  return out;
}

MessageTag Tag(MessageTag::Kind kind, int mb) { return MessageTag{kind, 5, mb, 0}; }

class TcpPairTest : public ::testing::Test {
 protected:
  void SetUp() override {
    addresses_ = Addresses(2);
    auto transports = ConnectAll(*backend_, {Options(0, addresses_), Options(1, addresses_)});
    ASSERT_THAT(transports[0], IsOk());
    ASSERT_THAT(transports[1], IsOk());
    t_[0] = std::move(*transports[0]);
    t_[1] = std::move(*transports[1]);
  }

  std::unique_ptr<backend::Backend> backend_ = backend::MakeCpuBackend();
  std::vector<std::string> addresses_;
  std::unique_ptr<TcpTransport> t_[2];
};

TEST_F(TcpPairTest, LargeTensorsBothDirectionsAtOnce) {
  // 8 MiB each way in each dtype: far beyond the socket buffers, so this
  // deadlocks unless receiving runs independently of sending.
  const backend::Shape half_shape{2048, 2048};
  const backend::Shape float_shape{1024, 2048};
  backend::Tensor sent[2][2];
  for (int s = 0; s < 2; ++s) {
    sent[s][0] = Filled(*backend_, DType::kFloat16, half_shape, 11 * s + 1);
    sent[s][1] = Filled(*backend_, DType::kFloat32, float_shape, 11 * s + 2);
  }
  absl::StatusOr<backend::Tensor> received[2][2];
  std::vector<std::thread> threads;
  for (int s = 0; s < 2; ++s) {
    threads.emplace_back([&, s] {
      const int peer = 1 - s;
      EXPECT_THAT(t_[s]->Send(peer, Tag(MessageTag::Kind::kActivation, s), sent[s][0]), IsOk());
      EXPECT_THAT(t_[s]->Send(peer, Tag(MessageTag::Kind::kGrad, s), sent[s][1]), IsOk());
      received[s][0] = t_[s]->Recv(peer, Tag(MessageTag::Kind::kActivation, peer));
      received[s][1] = t_[s]->Recv(peer, Tag(MessageTag::Kind::kGrad, peer));
    });
  }
  for (std::thread& t : threads) t.join();
  for (int s = 0; s < 2; ++s) {
    for (int k = 0; k < 2; ++k) {
      SCOPED_TRACE(::testing::Message() << "stage " << s << " message " << k);
      ASSERT_THAT(received[s][k], IsOk());
      const backend::Tensor& want = sent[1 - s][k];
      EXPECT_EQ(received[s][k]->dtype(), want.dtype());
      EXPECT_EQ(received[s][k]->shape(), want.shape());
      EXPECT_TRUE(Bytes(*backend_, *received[s][k]) == Bytes(*backend_, want));
    }
  }
}

TEST_F(TcpPairTest, WrongTagIsFailedPrecondition) {
  ASSERT_THAT(t_[0]->Send(1, Tag(MessageTag::Kind::kActivation, 1),
                          Filled(*backend_, DType::kFloat32, {3}, 0)),
              IsOk());
  EXPECT_THAT(t_[1]->Recv(0, Tag(MessageTag::Kind::kActivation, 2)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("expected activation(step=5, mb=2, chunk=0)"),
                             HasSubstr("received activation(step=5, mb=1, chunk=0)"),
                             HasSubstr(absl::StrCat("stage 0 at ", addresses_[0])))));
}

TEST_F(TcpPairTest, NotANeighbourIsInvalidArgument) {
  EXPECT_THAT(t_[0]->Send(2, Tag(MessageTag::Kind::kActivation, 0),
                          Filled(*backend_, DType::kFloat32, {3}, 0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stage 2")));
  EXPECT_THAT(t_[0]->Send(1, Tag(MessageTag::Kind::kActivation, 0), backend::Tensor()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("undefined")));
}

TEST_F(TcpPairTest, PeerDestroyedIsUnavailableAfterItsMessages) {
  ASSERT_THAT(t_[1]->Send(0, Tag(MessageTag::Kind::kGrad, 0),
                          Filled(*backend_, DType::kBFloat16, {2, 2}, 3)),
              IsOk());
  t_[1].reset();
  EXPECT_THAT(t_[0]->Recv(1, Tag(MessageTag::Kind::kGrad, 0)), IsOk());
  const auto unavailable = StatusIs(absl::StatusCode::kUnavailable,
                                    HasSubstr(absl::StrCat("stage 1 at ", addresses_[1])));
  EXPECT_THAT(t_[0]->Recv(1, Tag(MessageTag::Kind::kGrad, 1)), unavailable);
  EXPECT_THAT(t_[0]->Send(1, Tag(MessageTag::Kind::kActivation, 1),
                          Filled(*backend_, DType::kFloat32, {3}, 0)),
              unavailable);
}

// Two stages of one host: what fits in a slot goes through the receiver's
// inbox (here the CPU backend's shared memory file), the rest through the
// socket. Nine messages through two slots: the sender goes on only as the
// receiver's reader hands slots back, before anything is received.
TEST(TcpSharedMemoryTest, TensorsGoThroughTheInboxAndItsSlotsComeBack) {
  auto backend = backend::MakeCpuBackend();
  const std::vector<std::string> addresses = Addresses(2);
  std::vector<TcpTransportOptions> options = {Options(0, addresses), Options(1, addresses)};
  for (TcpTransportOptions& o : options) {
    o.inbox_slots = 2;
    o.inbox_slot_bytes = 64 << 10;
  }
  auto transports = ConnectAll(*backend, options);
  ASSERT_THAT(transports[0], IsOk());
  ASSERT_THAT(transports[1], IsOk());
  TcpTransport& sender = **transports[0];
  TcpTransport& receiver = **transports[1];
  EXPECT_EQ(sender.Route(1), "shared memory (cpu)");
  EXPECT_EQ(receiver.Route(0), "shared memory (cpu)");

  std::vector<backend::Tensor> sent;
  for (int mb = 0; mb < 9; ++mb) {
    sent.push_back(Filled(*backend, mb % 2 ? DType::kBFloat16 : DType::kFloat16, {64, 64}, mb));
    ASSERT_THAT(sender.Send(1, Tag(MessageTag::Kind::kActivation, mb), sent.back()), IsOk());
  }
  // 128 KiB of fp32 storage: larger than a slot.
  sent.push_back(Filled(*backend, DType::kFloat32, {256, 128}, 9));
  ASSERT_THAT(sender.Send(1, Tag(MessageTag::Kind::kActivation, 9), sent.back()), IsOk());
  for (int mb = 0; mb < 10; ++mb) {
    absl::StatusOr<backend::Tensor> got = receiver.Recv(0, Tag(MessageTag::Kind::kActivation, mb));
    ASSERT_THAT(got, IsOk());
    EXPECT_EQ(got->dtype(), sent[mb].dtype());
    EXPECT_EQ(got->shape(), sent[mb].shape());
    EXPECT_TRUE(Bytes(*backend, *got) == Bytes(*backend, sent[mb])) << "message " << mb;
  }
  EXPECT_EQ(sender.stats().messages_shared, 9);
  EXPECT_EQ(sender.stats().messages_over_socket, 1);
}

TEST(TcpSharedMemoryTest, AStageThatSharesNothingGetsEverythingOverTheSocket) {
  auto backend = backend::MakeCpuBackend();
  const std::vector<std::string> addresses = Addresses(2);
  std::vector<TcpTransportOptions> options = {Options(0, addresses), Options(1, addresses)};
  options[1].share_memory = false;
  auto transports = ConnectAll(*backend, options);
  ASSERT_THAT(transports[0], IsOk());
  ASSERT_THAT(transports[1], IsOk());
  EXPECT_EQ((*transports[0])->Route(1), "the socket (the peer shares no memory)");
  EXPECT_EQ((*transports[1])->Route(0), "the socket (share_memory is off)");
  const backend::Tensor t = Filled(*backend, DType::kFloat16, {4, 4}, 1);
  ASSERT_THAT((*transports[0])->Send(1, Tag(MessageTag::Kind::kGrad, 0), t), IsOk());
  ASSERT_THAT((*transports[1])->Send(0, Tag(MessageTag::Kind::kGrad, 0), t), IsOk());
  for (int s = 0; s < 2; ++s) {
    absl::StatusOr<backend::Tensor> got =
        (*transports[s])->Recv(1 - s, Tag(MessageTag::Kind::kGrad, 0));
    ASSERT_THAT(got, IsOk());
    EXPECT_TRUE(Bytes(*backend, *got) == Bytes(*backend, t));
    EXPECT_EQ((*transports[s])->stats().messages_over_socket, 1);
    EXPECT_EQ((*transports[s])->stats().messages_shared, 0);
  }
}

TEST(TcpTransportTest, RecvTimesOut) {
  std::unique_ptr<backend::Backend> backend = backend::MakeCpuBackend();
  const std::vector<std::string> addresses = Addresses(2);
  std::vector<TcpTransportOptions> options = {Options(0, addresses), Options(1, addresses)};
  options[0].recv_timeout = absl::Milliseconds(50);
  auto transports = ConnectAll(*backend, options);
  ASSERT_THAT(transports[0], IsOk());
  ASSERT_THAT(transports[1], IsOk());
  EXPECT_THAT((*transports[0])->Recv(1, Tag(MessageTag::Kind::kGrad, 0)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("grad(step=5, mb=0")));
}

TEST(TcpTransportTest, JobMismatchIsFailedPreconditionNamingBoth) {
  std::unique_ptr<backend::Backend> backend = backend::MakeCpuBackend();
  const std::vector<std::string> addresses = Addresses(2);
  auto transports =
      ConnectAll(*backend, {Options(0, addresses, "job-a"), Options(1, addresses, "job-b")});
  EXPECT_THAT(transports[1],
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr(absl::StrCat("stage 0 at ", addresses[0],
                                              " runs job 'job-a' with 2 stages; this stage (1) "
                                              "runs job 'job-b' with 2"))));
  EXPECT_THAT(transports[0],
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("stage 1"), HasSubstr("'job-b'"), HasSubstr("'job-a'"))));
}

TEST(TcpTransportTest, MissingPeerIsDeadlineExceeded) {
  std::unique_ptr<backend::Backend> backend = backend::MakeCpuBackend();
  const std::vector<std::string> addresses = Addresses(2);
  TcpTransportOptions options = Options(1, addresses);
  options.connect_timeout = absl::Milliseconds(200);
  EXPECT_THAT(
      TcpTransport::Connect(options, *backend),
      StatusIs(absl::StatusCode::kDeadlineExceeded,
               HasSubstr(absl::StrCat("stage 0 did not accept a connection at ", addresses[0]))));
  options.stage = 0;
  EXPECT_THAT(
      TcpTransport::Connect(options, *backend),
      StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("stage(s) 1 did not connect")));
  options.addresses[1] = "127.0.0.1";
  EXPECT_THAT(
      TcpTransport::Connect(options, *backend),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'127.0.0.1' is not host:port")));
  // A neighbour cannot connect to "any free port".
  options.addresses[1] = "127.0.0.1:0";
  EXPECT_THAT(TcpTransport::Connect(options, *backend),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'127.0.0.1:0' is not host:port (\"[address]:port\" for IPv6) "
                                 "with a port in [1, 65535]")));
}

// The test plays stage 1 of 2 over a raw socket.
class RawPeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    addresses_ = Addresses(2);
    std::atomic<bool> stage0_done{false};
    std::thread stage0([&] {
      transport_ = TcpTransport::Connect(Options(0, addresses_), *backend_);
      stage0_done = true;
    });
    const int port = std::stoi(addresses_[0].substr(addresses_[0].rfind(':') + 1));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    // Stage 0 listening shows only as a connect that succeeds: try until it
    // does, or until stage 0 has given up (its connect_timeout).
    while (!stage0_done) {
      fd_ = socket(AF_INET, SOCK_STREAM, 0);
      if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) break;
      close(fd_);
      fd_ = -1;
      std::this_thread::yield();
    }
    if (fd_ < 0) stage0.join();
    ASSERT_GE(fd_, 0) << transport_.status();
    const std::string hello =
        hello_override_.empty()
            ? pipeline_internal::EncodeHello(
                  {.stages = 2, .stage = 1, .job = "job-1", .host = "", .sharing = "", .link = ""})
            : hello_override_;
    ASSERT_EQ(write(fd_, hello.data(), hello.size()), static_cast<ssize_t>(hello.size()));
    stage0.join();
  }
  void TearDown() override {
    if (fd_ >= 0) close(fd_);
  }

  void SendRaw(const void* data, size_t n) {
    ASSERT_EQ(send(fd_, data, n, MSG_NOSIGNAL), static_cast<ssize_t>(n));
  }

  std::unique_ptr<backend::Backend> backend_ = backend::MakeCpuBackend();
  std::vector<std::string> addresses_;
  std::string hello_override_;
  absl::StatusOr<std::unique_ptr<TcpTransport>> transport_ = absl::UnknownError("not run");
  int fd_ = -1;
};

TEST_F(RawPeerTest, GarbageFrameIsDataLoss) {
  ASSERT_THAT(transport_, IsOk());
  const std::string garbage(pipeline_internal::kFrameHeaderBytes, 'x');
  SendRaw(garbage.data(), garbage.size());
  EXPECT_THAT((*transport_)->Recv(1, Tag(MessageTag::Kind::kActivation, 0)),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(absl::StrCat("stage 1 at ", addresses_[1])),
                             HasSubstr("bad magic"))));
  // Sticky.
  EXPECT_THAT((*transport_)->Recv(1, Tag(MessageTag::Kind::kActivation, 0)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bad magic")));
}

TEST_F(RawPeerTest, ValidFrameThenPayloadSizeMismatchIsDataLoss) {
  ASSERT_THAT(transport_, IsOk());
  std::array<std::byte, pipeline_internal::kFrameHeaderBytes> header;
  pipeline_internal::FrameHeader h{Tag(MessageTag::Kind::kGrad, 3), DType::kFloat16, {2, 3}, 12};
  pipeline_internal::EncodeFrameHeader(h, header.data());
  const std::array<uint16_t, 6> payload = {0x3c00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600};
  SendRaw(header.data(), header.size());
  SendRaw(payload.data(), sizeof(payload));
  h.payload_bytes = 13;  // not 2 x 3 x 2
  pipeline_internal::EncodeFrameHeader(h, header.data());
  SendRaw(header.data(), header.size());

  absl::StatusOr<backend::Tensor> got = (*transport_)->Recv(1, Tag(MessageTag::Kind::kGrad, 3));
  ASSERT_THAT(got, IsOk());
  std::vector<float> values(6);
  ASSERT_THAT(backend_->DownloadFloat(*got, absl::MakeSpan(values)), IsOk());
  EXPECT_THAT(values, ::testing::ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_THAT((*transport_)->Recv(1, Tag(MessageTag::Kind::kGrad, 3)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("announces 13 payload bytes")));
}

TEST_F(RawPeerTest, OversizedOrHighRankFrameIsDataLoss) {
  ASSERT_THAT(transport_, IsOk());
  std::array<std::byte, pipeline_internal::kFrameHeaderBytes> header;
  pipeline_internal::FrameHeader h{Tag(MessageTag::Kind::kGrad, 0),
                                   DType::kFloat32,
                                   {int64_t{1} << 20, int64_t{1} << 20},
                                   uint64_t{4} << 40};
  pipeline_internal::EncodeFrameHeader(h, header.data());
  SendRaw(header.data(), header.size());
  EXPECT_THAT((*transport_)->Recv(1, Tag(MessageTag::Kind::kGrad, 0)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("exceeds the limit")));

  EXPECT_THAT(pipeline_internal::DecodeFrameHeader(
                  [] {
                    std::array<std::byte, pipeline_internal::kFrameHeaderBytes> b;
                    pipeline_internal::EncodeFrameHeader(
                        {Tag(MessageTag::Kind::kGrad, 0), DType::kFloat32, backend::Shape(9, 1), 4},
                        b.data());
                    return b;
                  }(),
                  1 << 30),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("rank 9 > 8")));
}

// The raw peer's handshake names no host, so stage 0 kept no inbox for it.
TEST_F(RawPeerTest, AMessageInASlotNeverOfferedIsDataLoss) {
  ASSERT_THAT(transport_, IsOk());
  EXPECT_EQ((*transport_)->Route(1), "the socket (the peer runs on another host)");
  std::array<std::byte, pipeline_internal::kFrameHeaderBytes> header;
  pipeline_internal::EncodeFrameHeader({.tag = Tag(MessageTag::Kind::kGrad, 0),
                                        .dtype = DType::kFloat16,
                                        .shape = {2},
                                        .payload_bytes = 4,
                                        .slot = 0},
                                       header.data());
  SendRaw(header.data(), header.size());
  EXPECT_THAT((*transport_)->Recv(1, Tag(MessageTag::Kind::kGrad, 0)),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("a message in inbox slot 0, but none was offered")));
}

TEST_F(RawPeerTest, ACreditForASlotNeverSentToIsDataLoss) {
  ASSERT_THAT(transport_, IsOk());
  std::array<std::byte, pipeline_internal::kFrameHeaderBytes> header;
  pipeline_internal::EncodeFrameHeader(pipeline_internal::Credit(3), header.data());
  SendRaw(header.data(), header.size());
  EXPECT_THAT((*transport_)->Recv(1, Tag(MessageTag::Kind::kGrad, 0)),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("a credit for slot 3, which holds nothing sent to it")));
}

TEST(TcpWireTest, SlotsAndCreditsSurviveTheRoundTrip) {
  std::array<std::byte, pipeline_internal::kFrameHeaderBytes> bytes;
  pipeline_internal::EncodeFrameHeader({.tag = Tag(MessageTag::Kind::kActivation, 2),
                                        .dtype = DType::kBFloat16,
                                        .shape = {3, 5},
                                        .payload_bytes = 30,
                                        .slot = 254},
                                       bytes.data());
  absl::StatusOr<pipeline_internal::FrameHeader> h =
      pipeline_internal::DecodeFrameHeader(bytes, 1 << 30);
  ASSERT_THAT(h, IsOk());
  EXPECT_EQ(h->slot, 254);
  EXPECT_FALSE(h->credit);
  EXPECT_EQ(h->tag, Tag(MessageTag::Kind::kActivation, 2));
  EXPECT_EQ(h->shape, (backend::Shape{3, 5}));

  pipeline_internal::EncodeFrameHeader(pipeline_internal::Credit(7), bytes.data());
  h = pipeline_internal::DecodeFrameHeader(bytes, 1 << 30);
  ASSERT_THAT(h, IsOk());
  EXPECT_TRUE(h->credit);
  EXPECT_EQ(h->slot, 7);

  pipeline_internal::EncodeFrameHeader(pipeline_internal::Credit(-1), bytes.data());  // no slot
  EXPECT_THAT(pipeline_internal::DecodeFrameHeader(bytes, 1 << 30),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("credit frame for slot -1")));
}

// Found by fuzz/tcp_frame_fuzzer.cc: past a zero dimension the others went
// unchecked, so an empty tensor of shape [1, 0, 2^61, 2^61] was accepted.
TEST(TcpWireTest, HugeDimensionsBesideAZeroAreDataLoss) {
  std::array<std::byte, pipeline_internal::kFrameHeaderBytes> b;
  pipeline_internal::EncodeFrameHeader({Tag(MessageTag::Kind::kGrad, 0),
                                        DType::kFloat16,
                                        {1, 0, int64_t{1} << 61, int64_t{1} << 61},
                                        0},
                                       b.data());
  EXPECT_THAT(pipeline_internal::DecodeFrameHeader(b, 1 << 30),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("exceeds the limit")));
  // An empty tensor of sensible dimensions still passes.
  pipeline_internal::EncodeFrameHeader(
      {Tag(MessageTag::Kind::kGrad, 0), DType::kFloat16, {8, 0, 768}, 0}, b.data());
  EXPECT_THAT(pipeline_internal::DecodeFrameHeader(b, 1 << 30), IsOk());
}

class BadHelloTest : public RawPeerTest {
 protected:
  void SetUp() override {
    hello_override_ = std::string(40, 'z');
    RawPeerTest::SetUp();
  }
};

TEST_F(BadHelloTest, IsDataLoss) {
  EXPECT_THAT(transport_,
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("not a zo pipeline stage")));
}

struct ToyResult {
  std::map<int, float> losses;
  std::map<int, std::vector<float>> grads;
};

// Runs two steps of `programs` with every stage on its own thread.
ToyResult RunToyPipeline(backend::Backend& backend, const std::vector<StageProgram>& programs,
                         int chunks, const std::vector<Transport*>& transports,
                         InProcessFabric* fabric) {
  const int stages = static_cast<int>(programs.size());
  std::vector<std::unique_ptr<ToyStageModule>> modules;
  for (int s = 0; s < stages; ++s) {
    modules.push_back(std::make_unique<ToyStageModule>(
        backend, ToyStageModule::PipelineLayers(s, stages, chunks), s == 0, s == stages - 1));
  }
  std::vector<std::thread> threads;
  for (int s = 0; s < stages; ++s) {
    threads.emplace_back([&, s] {
      Executor executor(s, stages, chunks, programs[s], *modules[s], *transports[s]);
      for (int64_t step = 1; step <= 2; ++step) {  // the connections carry several steps
        absl::StatusOr<StepTimes> times = executor.RunStep(step);
        EXPECT_THAT(times, IsOk()) << "stage " << s;
        if (!times.ok() && fabric != nullptr) fabric->Abort(times.status());
        if (!times.ok()) return;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ToyResult result;
  result.losses = modules.back()->losses();
  for (const auto& m : modules) result.grads.insert(m->grads().begin(), m->grads().end());
  return result;
}

void ExpectTcpMatchesInProcess(int stages, int micro_batches, int chunks) {
  std::unique_ptr<backend::Backend> backend = backend::MakeCpuBackend();
  absl::StatusOr<std::vector<StageProgram>> programs =
      chunks == 1 ? OneFOneBSchedule(stages, micro_batches)
                  : InterleavedOneFOneBSchedule(stages, micro_batches, chunks);
  ASSERT_THAT(programs, IsOk());

  InProcessFabric fabric(stages, absl::Seconds(20));
  std::vector<Transport*> in_process;
  for (int s = 0; s < stages; ++s) in_process.push_back(&fabric.ForStage(s));
  const ToyResult want = RunToyPipeline(*backend, *programs, chunks, in_process, &fabric);

  const std::vector<std::string> addresses = Addresses(stages);
  std::vector<TcpTransportOptions> options;
  for (int s = 0; s < stages; ++s) options.push_back(Options(s, addresses));
  auto connected = ConnectAll(*backend, options);
  std::vector<Transport*> tcp;
  for (int s = 0; s < stages; ++s) {
    ASSERT_THAT(connected[s], IsOk()) << "stage " << s;
    tcp.push_back(connected[s]->get());
  }
  const ToyResult got = RunToyPipeline(*backend, *programs, chunks, tcp, nullptr);

  EXPECT_EQ(got.losses.size(), static_cast<size_t>(micro_batches));
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.grads.size(), static_cast<size_t>(stages * chunks));
  EXPECT_EQ(got.grads, want.grads);
}

TEST(TcpExecutorTest, OneFOneBTwoStagesMatchesInProcess) { ExpectTcpMatchesInProcess(2, 5, 1); }

// Three processes in a ring: stage 2's activations wrap around to stage 0.
TEST(TcpExecutorTest, InterleavedThreeStagesMatchesInProcess) {
  ExpectTcpMatchesInProcess(3, 6, 2);
}

TEST(TcpExecutorTest, OneStageInterleavedSendsToItself) {
  std::unique_ptr<backend::Backend> backend = backend::MakeCpuBackend();
  absl::StatusOr<std::vector<StageProgram>> programs = InterleavedOneFOneBSchedule(1, 2, 2);
  ASSERT_THAT(programs, IsOk());
  TcpTransportOptions options;
  options.addresses = {"127.0.0.1:1"};  // never listened on: a single stage has no neighbours
  options.job = "solo";
  ZO_ASSERT_OK_AND_ASSIGN(std::unique_ptr<TcpTransport> transport,
                          TcpTransport::Connect(options, *backend));
  ToyStageModule module(*backend, ToyStageModule::PipelineLayers(0, 1, 2), true, true);
  Executor executor(0, 1, 2, (*programs)[0], module, *transport);
  EXPECT_THAT(executor.RunStep(1), IsOk());
  EXPECT_EQ(module.losses().size(), 2u);
}

}  // namespace
}  // namespace zo::pipeline
