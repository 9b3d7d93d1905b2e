// Hostile and malformed calls against a real zo-server process: each gets
// the right status code and a message a person can act on, and none of them
// disturbs the job: the steps around them still give the reference result.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/host_memory.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "rpc/byte_stream_call.h"
#include "rpc/call_context.h"
#include "rpc/channel.h"
#include "rpc/rpc_util.h"
#include "tests/server/least_squares.h"
#include "tests/server/server_process.h"
#include "tests/server/training_harness.h"

namespace zo::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kToken[] = "s3cret-token";

const std::string kConfig = R"({
  "train_batch_size": 2, "train_micro_batch_size_per_gpu": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
  "gradient_clipping": 0.5,
  "zo": {"chunk_elems": 256}
})";

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    token_file_ = absl::StrCat(::testing::TempDir(), "/zo_bad_input_token_", getpid());
    std::ofstream(token_file_) << kToken << "\n";
    ZO_ASSERT_OK_AND_ASSIGN(server_, ServerProcess::Start({"--auth-token-file", token_file_,
                                                           "--max-message-bytes", "1536Ki"}));
    // Room to send more than the server accepts.
    ZO_ASSERT_OK_AND_ASSIGN(channel_,
                            NewChannel(server_->address(), {.max_message_bytes = 8 << 20}));
    stub_ = v1::Offload::NewStub(channel_);
  }

  std::unique_ptr<grpc::ClientContext> Context(const std::string& token = kToken,
                                               absl::Duration timeout = absl::Seconds(10)) {
    return NewCallContext({.timeout = timeout, .auth_token = token});
  }

  // Pushes one piece on its own stream and returns the call's status.
  absl::Status OpenOn(ServerProcess& server, const std::string& job, const std::string& name,
                      const std::vector<int64_t>& shape, const std::string& config = kConfig);

  absl::Status PushRaw(const v1::GradientPiece& piece, absl::Duration timeout = absl::Seconds(10)) {
    auto context = Context(kToken, timeout);
    v1::PushGradientsResponse response;
    auto writer = stub_->PushGradients(context.get(), &response);
    writer->Write(piece);
    writer->WritesDone();
    return FromGrpcStatus(writer->Finish());
  }

  // A well-formed piece of job "bad", step 1, dp rank 1 (which has not pushed).
  v1::GradientPiece ValidPiece() {
    v1::GradientPiece piece;
    piece.set_job("bad");
    piece.set_step(1);
    piece.set_dp_rank(1);
    piece.set_chunk(0);
    piece.set_offset(0);
    piece.set_dtype(v1::DTYPE_FP32);
    piece.set_data(std::string(40, '\x7f'));  // 10 huge floats: would wreck the step
    return piece;
  }

  std::string token_file_;
  std::optional<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Offload::Stub> stub_;
};

TEST_F(BadInputTest, EachBadCallIsRefusedAndTheJobStillMatchesTheReference) {
  const LeastSquares p = LeastSquares::Make({300, 100}, 32, 2, 11);
  ClientOptions options;
  options.auth_token = kToken;
  ZO_ASSERT_OK_AND_ASSIGN(
      auto workers, OpenWorkers(p, DType::kFloat32, "bad", kConfig, {server_->address()}, options));
  ASSERT_THAT(workers[0]->InitWeights(), IsOk());
  // Rank 0 delivers step 1; rank 1 has not yet, so the step stays open.
  ASSERT_THAT(workers[0]->RunStep(1, false), IsOk());

  {  // wrong token, and none at all
    ClientOptions wrong = options;
    wrong.auth_token = "guess";
    wrong.job = "bad";
    wrong.servers = {server_->address()};
    EXPECT_THAT(OffloadClient::Open(wrong, kConfig, ManifestOf(p, DType::kFloat32)).status(),
                StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("wrong token")));
    v1::GetJobStatusRequest request;
    request.set_job("bad");
    v1::JobStatus status;
    EXPECT_THAT(FromGrpcStatus(stub_->GetJobStatus(Context("").get(), request, &status)),
                StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("requires a token")));
    // Logged with the client's host, never with the token it tried.
    const std::string log = server_->ReadLog();
    EXPECT_THAT(log, HasSubstr("refused a call from 127.0.0.1: wrong token"));
    EXPECT_THAT(log, ::testing::Not(HasSubstr("guess")));
  }
  {  // unknown job
    v1::GetJobStatusRequest request;
    request.set_job("nosuchjob");
    v1::JobStatus status;
    EXPECT_THAT(FromGrpcStatus(stub_->GetJobStatus(Context().get(), request, &status)),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("nosuchjob")));
  }
  {  // manifest mismatch on attach
    ClientOptions other = options;
    other.job = "bad";
    other.servers = {server_->address()};
    std::vector<TensorSpec> manifest = ManifestOf(p, DType::kFloat32);
    manifest[1].shape = {99};
    EXPECT_THAT(OffloadClient::Open(other, kConfig, manifest).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("layer1.weight")));
  }
  {  // wrong length: 3 bytes of fp32
    v1::GradientPiece piece = ValidPiece();
    piece.set_data("abc");
    EXPECT_THAT(PushRaw(piece),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a positive multiple")));
  }
  {  // offset past the chunk's end
    v1::GradientPiece piece = ValidPiece();
    piece.set_offset(250);
    EXPECT_THAT(PushRaw(piece),
                StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("outside chunk 0")));
  }
  {  // a piece rank 0 already delivered, with garbage values
    v1::GradientPiece piece = ValidPiece();
    piece.set_dp_rank(0);
    EXPECT_THAT(PushRaw(piece), StatusIs(absl::StatusCode::kAlreadyExists,
                                         HasSubstr("already pushed by dp rank 0")));
  }
  {  // a step that is not open: past, far future, and next (which waits, here past its deadline)
    v1::GradientPiece piece = ValidPiece();
    piece.set_step(0);
    EXPECT_THAT(PushRaw(piece), StatusIs(absl::StatusCode::kFailedPrecondition,
                                         HasSubstr("takes gradients for step 1")));
    piece.set_step(7);
    EXPECT_THAT(PushRaw(piece),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("step 7 is not open")));
    piece.set_step(2);
    EXPECT_THAT(PushRaw(piece, absl::Milliseconds(300)),
                StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
  }
  {  // dp rank out of range, wrong dtype, chunk that does not exist
    v1::GradientPiece piece = ValidPiece();
    piece.set_dp_rank(2);
    EXPECT_THAT(PushRaw(piece),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dp_rank 2 is outside")));
    piece = ValidPiece();
    piece.set_dtype(v1::DTYPE_FP16);
    EXPECT_THAT(PushRaw(piece),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not the job's fp32")));
    piece = ValidPiece();
    piece.set_chunk(99);
    EXPECT_THAT(PushRaw(piece),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("chunk 99 does not exist")));
  }
  {  // bytes that are not a GradientPiece at all
    auto context = Context();
    v1::PushGradientsResponse response;
    ByteStreamCall call(channel_, context.get(), "/zo.v1.Offload/PushGradients");
    const std::string junk(
        "\x0a\x03"
        "ba",
        4);  // a job name cut short
    grpc::Slice slice(junk.data(), junk.size());
    call.Write(grpc::ByteBuffer(&slice, 1));
    EXPECT_THAT(FromGrpcStatus(call.Finish(&response)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("malformed GradientPiece")));
  }
  {  // a message over the server's limit
    v1::GradientPiece piece = ValidPiece();
    piece.set_data(std::string(2 << 20, '\0'));
    EXPECT_THAT(PushRaw(piece), StatusIs(absl::StatusCode::kResourceExhausted, ::testing::_));
  }
  {  // garbage bytes on the socket: the connection is dropped, the server lives
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server_->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    std::mt19937 rng(3);
    std::string junk(64 << 10, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    (void)!write(fd, junk.data(), junk.size());
    timeval tv{.tv_sec = 5, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[4096];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    close(fd);
    v1::GetServerInfoRequest request;
    v1::GetServerInfoResponse info;
    EXPECT_THAT(FromGrpcStatus(stub_->GetServerInfo(Context().get(), request, &info)), IsOk());
    EXPECT_THAT(info.jobs(), ::testing::ElementsAre("bad"));
  }

  // Rank 1 completes step 1, then both run on: the reference trajectory.
  ASSERT_THAT(workers[1]->RunStep(1, false), IsOk());
  ASSERT_THAT(RunSteps(workers, 2, 10), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<float> x, workers[0]->PullAll(10));
  Reference ref(p, {.lr_min = 0.01, .lr_max = 0.01, .clipping = 0.5});
  for (int s = 1; s <= 10; ++s) ref.Step(s, false, 1.0);
  double worst = 0;
  for (int i = 0; i < p.n; ++i) {
    worst = std::max(worst, std::abs(x[i] - ref.master()[i]) / (1 + std::abs(ref.master()[i])));
  }
  EXPECT_LT(worst, 1e-5);
  server_->Stop();
}

// OpenJob requests no server should try to build: a model the host's RAM
// cannot hold, names and shapes past the bounds, one job more than
// --max-jobs. Each is refused before anything is allocated, saying why, and
// the server goes on serving.
// OpenJob of a one-tensor job (fp32, two dp ranks) on `server` alone.
absl::Status BadInputTest::OpenOn(ServerProcess& server, const std::string& job,
                                  const std::string& name, const std::vector<int64_t>& shape,
                                  const std::string& config) {
  v1::OpenJobRequest request;
  request.set_job(job);
  request.set_config_json(config);
  request.set_dp_world_size(2);
  request.add_servers(server.address());
  v1::TensorSpec* t = request.mutable_manifest()->add_tensors();
  t->set_name(name);
  for (int64_t d : shape) t->add_shape(d);
  t->set_dtype(v1::DTYPE_FP32);
  v1::OpenJobResponse response;
  ZO_ASSIGN_OR_RETURN(auto channel, NewChannel(server.address(), {}));
  return FromGrpcStatus(
      v1::Offload::NewStub(channel)->OpenJob(Context().get(), request, &response));
}

TEST_F(BadInputTest, OversizedJobsAreRefusedBeforeAnythingIsAllocated) {
  const auto open = [&](ServerProcess& server, const std::string& job,
                        const std::pair<std::string, std::vector<int64_t>>& tensor,
                        const std::string& config = kConfig) {
    return OpenOn(server, job, tensor.first, tensor.second, config);
  };
  const auto tensor = [](std::string name, std::vector<int64_t> shape) {
    return std::make_pair(std::move(name), std::move(shape));
  };
  // 2^40 fp32 elements: in chunks of 256, too many chunks to keep track of;
  // in chunks of 2^30, 16 bytes each here (state, fp32 gradients; pulls round the
  // master).
  EXPECT_THAT(open(*server_, "huge", tensor("w", {int64_t{1} << 40})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("4294967296 chunks of 256, more than the 4194304")));
  std::string big_chunks = kConfig;
  big_chunks.replace(big_chunks.find("256"), 3, "1073741824");
  EXPECT_THAT(open(*server_, "huge", tensor("w", {int64_t{1} << 40}), big_chunks),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("job huge needs 16.00 TiB of RAM on this server"),
                             HasSubstr("is available"))));
  EXPECT_THAT(
      open(*server_, "long-name", tensor(std::string(2000, 'n'), {4})),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("names are at most 1024 bytes")));
  EXPECT_THAT(open(*server_, "deep", tensor("w", {1, 1, 1, 1, 1, 1, 1, 1, 2})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 8 dimensions")));

  ZO_ASSERT_OK_AND_ASSIGN(ServerProcess two, ServerProcess::Start({"--auth-token-file", token_file_,
                                                                   "--max-jobs", "2"}));
  EXPECT_THAT(open(two, "one", tensor("w", {4})), IsOk());
  EXPECT_THAT(open(two, "two", tensor("w", {4})), IsOk());
  EXPECT_THAT(open(two, "three", tensor("w", {4})),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("this server holds 2 jobs, its --max-jobs")));
  EXPECT_THAT(open(two, "one", tensor("w", {4})), IsOk());  // attaching is not opening
  v1::GetServerInfoRequest request;
  v1::GetServerInfoResponse info;
  EXPECT_THAT(FromGrpcStatus(stub_->GetServerInfo(Context().get(), request, &info)), IsOk());
  EXPECT_THAT(info.jobs(), ::testing::IsEmpty());
  two.Stop();
  server_->Stop();
}

// A memory cgroup of the test's own, removed at the end: v2 where the
// process is in a v2 hierarchy with the memory controller, else v1's.
class MemoryCgroup {
 public:
  static absl::StatusOr<std::unique_ptr<MemoryCgroup>> Make(int64_t limit_bytes) {
    std::ifstream self("/proc/self/cgroup");
    const CgroupPaths paths = ParseCgroupPaths(
        std::string((std::istreambuf_iterator<char>(self)), std::istreambuf_iterator<char>()));
    const std::string name = absl::StrCat("zo_bad_input_", getpid());
    std::vector<std::pair<std::string, std::string>> tries;  // dir, limit file
    if (!paths.v2.empty() && std::ifstream("/sys/fs/cgroup/cgroup.controllers")) {
      tries.emplace_back(absl::StrCat("/sys/fs/cgroup", paths.v2, "/", name), "memory.max");
    }
    if (!paths.v1_memory.empty()) {
      tries.emplace_back(absl::StrCat("/sys/fs/cgroup/memory", paths.v1_memory, "/", name),
                         "memory.limit_in_bytes");
    }
    for (const auto& [dir, limit_file] : tries) {
      if (mkdir(dir.c_str(), 0755) != 0) continue;
      auto cgroup = std::unique_ptr<MemoryCgroup>(new MemoryCgroup(dir));
      std::ofstream(dir + "/" + limit_file) << limit_bytes;
      int64_t read = 0;
      std::ifstream(dir + "/" + limit_file) >> read;
      if (read > 0 && read <= limit_bytes) return cgroup;
    }
    return absl::UnavailableError("cannot make a memory cgroup with a limit here");
  }
  ~MemoryCgroup() { rmdir(dir_.c_str()); }

  absl::Status Move(pid_t pid) const {
    std::ofstream procs(dir_ + "/cgroup.procs");
    procs << pid << std::flush;
    return procs ? absl::OkStatus() : absl::UnavailableError("cannot move into the cgroup");
  }

 private:
  explicit MemoryCgroup(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

// A server in a pod or a systemd unit with a memory limit admits what the
// limit allows, not what the host has (the OOM killer acts on the cgroup).
TEST_F(BadInputTest, AServerAdmitsWhatItsMemoryCgroupAllows) {
  absl::StatusOr<std::unique_ptr<MemoryCgroup>> cgroup = MemoryCgroup::Make(int64_t{96} << 20);
  if (!cgroup.ok()) GTEST_SKIP() << cgroup.status() << " (needs root and a writable cgroupfs)";
  ZO_ASSERT_OK_AND_ASSIGN(ServerProcess server,
                          ServerProcess::Start({"--auth-token-file", token_file_}));
  ASSERT_THAT((*cgroup)->Move(server.pid()), IsOk());
  // 16 Mi fp32 elements need 256 MiB here: far less than the host has, more
  // than the cgroup's 96 MiB.
  EXPECT_THAT(OpenOn(server, "big", "w", {int64_t{16} << 20}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("job big needs 256.0 MiB of RAM on this server"),
                             HasSubstr("memory cgroup"))));
  EXPECT_THAT(OpenOn(server, "small", "w", {int64_t{1} << 20}), IsOk());  // 16 MiB
  server.Kill();  // out of the cgroup before it is removed
}

}  // namespace
}  // namespace zo::testing
