// Two stage processes on one GPU host hand tensors over through CUDA IPC:
// the receiver's inbox in device memory, no host bounce. Each stage is a
// child process (CUDA cannot be used across fork, and IPC maps only
// another process's memory); the parent only forks and reads exit codes.
// With two GPUs the stages sit on different devices (peer access), and the
// same exchange runs over an NCCL device link as between hosts (NCCL
// refuses two ranks on one GPU, so that case needs two).
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/free_port.h"
#include "gtest/gtest.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/pipeline/tcp_transport.h"

namespace zo::pipeline {
namespace {

constexpr int kSkip = 77;
constexpr int kSharedMessages = 9;

// Small integers: exact in fp16, bf16 and fp32.
std::vector<float> Pattern(int64_t n, int seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = static_cast<float>((i * 7 + seed) % 255 - 127);
  return v;
}

#define STAGE_CHECK(cond, ...)                                \
  do {                                                        \
    if (!(cond)) {                                            \
      std::fprintf(stderr, "stage %d: ", stage);              \
      std::fprintf(stderr, __VA_ARGS__);                      \
      std::fprintf(stderr, " (%s:%d)\n", __FILE__, __LINE__); \
      return 1;                                               \
    }                                                         \
  } while (0)

// Stage 0 sends kSharedMessages activations that fit a slot and one that
// does not; stage 1 checks them and answers with a gradient. With `link`
// all go over an NCCL device link instead.
int RunStage(int stage, const std::vector<std::string>& addresses, bool link) {
  std::string why;
  const int devices = backend::CudaDeviceCount(&why);
  // ZO_NCCL_ON_ONE_GPU=1 tries the link on one GPU all the same (whether
  // this NCCL accepts two ranks there).
  const bool one_gpu_link = link && std::getenv("ZO_NCCL_ON_ONE_GPU") != nullptr;
  if (devices < (link && !one_gpu_link ? 2 : 1)) {
    std::fprintf(stderr, "stage %d: %d CUDA device(s) %s\n", stage, devices, why.c_str());
    return kSkip;
  }
  absl::StatusOr<std::unique_ptr<backend::Backend>> made =
      backend::MakeCudaBackend({.device = stage % devices});
  STAGE_CHECK(made.ok(), "%s", made.status().ToString().c_str());
  backend::Backend& b = **made;
  TcpTransportOptions options{.stage = stage, .stages = 2, .addresses = addresses, .job = "ipc"};
  options.connect_timeout = absl::Seconds(30);
  options.recv_timeout = absl::Seconds(30);
  options.inbox_slots = 2;
  options.inbox_slot_bytes = 1 << 20;
  options.prefer_device_link = link;
  absl::StatusOr<std::unique_ptr<TcpTransport>> connected = TcpTransport::Connect(options, b);
  STAGE_CHECK(connected.ok(), "%s", connected.status().ToString().c_str());
  TcpTransport& t = **connected;
  const int peer = 1 - stage;
  const std::string route = t.Route(peer);
  STAGE_CHECK(absl::StartsWith(route, link ? "a device link (cuda:" : "shared memory (cuda:"),
              "route %s", route.c_str());
  std::fprintf(stderr, "stage %d on %s: tensors to stage %d through %s\n", stage, b.name().c_str(),
               peer, route.c_str());

  auto filled = [&](DType dtype, backend::Shape shape, int seed) {
    backend::Tensor x = b.Empty(dtype, shape);
    (void)b.UploadFloat(Pattern(x.numel(), seed), x);
    // The tensor sent is an op's output still queued on the compute
    // stream: Put must copy it only after the op.
    return b.Add(x, b.Zeros(dtype, shape));
  };
  auto same = [&](const backend::Tensor& got, int seed) {
    std::vector<float> values(static_cast<size_t>(got.numel()));
    if (!b.DownloadFloat(got, absl::MakeSpan(values)).ok()) return false;
    return values == Pattern(got.numel(), seed);
  };
  const MessageTag grad{MessageTag::Kind::kGrad, 1, 0, 0};
  if (stage == 0) {
    for (int mb = 0; mb <= kSharedMessages; ++mb) {
      // 256 KiB in a 1 MiB slot; the last, 2 MiB of fp32, goes by the socket.
      const backend::Tensor x =
          mb < kSharedMessages ? filled(mb % 2 ? DType::kBFloat16 : DType::kFloat16, {256, 512}, mb)
                               : filled(DType::kFloat32, {512, 1024}, mb);
      absl::Status s = t.Send(1, {MessageTag::Kind::kActivation, 1, mb, 0}, x);
      STAGE_CHECK(s.ok(), "send %d: %s", mb, s.ToString().c_str());
    }  // each tensor dropped at once: the transport keeps it until its slot comes back
    absl::StatusOr<backend::Tensor> g = t.Recv(1, grad);
    STAGE_CHECK(g.ok(), "%s", g.status().ToString().c_str());
    STAGE_CHECK(same(*g, 1000), "the gradient differs");
    const TcpTransportStats stats = t.stats();
    const int64_t off_socket = link ? stats.messages_linked : stats.messages_shared;
    STAGE_CHECK(
        link ? stats.messages_linked == kSharedMessages + 1 && stats.messages_over_socket == 0
             : off_socket == kSharedMessages && stats.messages_over_socket == 1,
        "%lld linked, %lld shared, %lld over the socket",
        static_cast<long long>(stats.messages_linked),
        static_cast<long long>(stats.messages_shared),
        static_cast<long long>(stats.messages_over_socket));
  } else {
    for (int mb = 0; mb <= kSharedMessages; ++mb) {
      absl::StatusOr<backend::Tensor> x = t.Recv(0, {MessageTag::Kind::kActivation, 1, mb, 0});
      STAGE_CHECK(x.ok(), "recv %d: %s", mb, x.status().ToString().c_str());
      STAGE_CHECK(same(*x, mb), "message %d differs", mb);
    }
    absl::Status s = t.Send(0, grad, filled(DType::kFloat16, {256, 512}, 1000));
    STAGE_CHECK(s.ok(), "%s", s.ToString().c_str());
    STAGE_CHECK((link ? t.stats().messages_linked : t.stats().messages_shared) == 1,
                "the gradient went through the socket");
    // Stay connected until stage 0 has its gradient (its Recv, then EOF).
    absl::StatusOr<backend::Tensor> eof = t.Recv(0, grad);
    STAGE_CHECK(eof.status().code() == absl::StatusCode::kUnavailable, "%s",
                eof.status().ToString().c_str());
  }
  return 0;
}

// Stage 0 sends kStreamed activations of 32 MiB, stage 1 receives them;
// stage 1 prints the rate (a figure for the log, not a verdict: speed is
// zo-bench's business).
constexpr int kStreamed = 32;

int StreamStage(int stage, const std::vector<std::string>& addresses, bool share) {
  std::string why;
  const int devices = backend::CudaDeviceCount(&why);
  if (devices == 0) return kSkip;
  absl::StatusOr<std::unique_ptr<backend::Backend>> made =
      backend::MakeCudaBackend({.device = stage % devices});
  STAGE_CHECK(made.ok(), "%s", made.status().ToString().c_str());
  backend::Backend& b = **made;
  TcpTransportOptions options{.stage = stage, .stages = 2, .addresses = addresses, .job = "ipc"};
  options.share_memory = share;
  absl::StatusOr<std::unique_ptr<TcpTransport>> connected = TcpTransport::Connect(options, b);
  STAGE_CHECK(connected.ok(), "%s", connected.status().ToString().c_str());
  TcpTransport& t = **connected;
  const backend::Shape shape{4096, 4096};  // bf16: 32 MiB
  if (stage == 0) {
    backend::Tensor x = b.Zeros(DType::kBFloat16, shape);
    for (int mb = 0; mb < kStreamed; ++mb) {
      absl::Status s = t.Send(1, {MessageTag::Kind::kActivation, 1, mb, 0}, b.Add(x, x));
      STAGE_CHECK(s.ok(), "%s", s.ToString().c_str());
    }
    absl::StatusOr<backend::Tensor> done = t.Recv(1, {MessageTag::Kind::kGrad, 1, 0, 0});
    STAGE_CHECK(done.ok(), "%s", done.status().ToString().c_str());
  } else {
    const auto start = std::chrono::steady_clock::now();
    for (int mb = 0; mb < kStreamed; ++mb) {
      absl::StatusOr<backend::Tensor> x = t.Recv(0, {MessageTag::Kind::kActivation, 1, mb, 0});
      STAGE_CHECK(x.ok(), "%s", x.status().ToString().c_str());
    }
    b.Synchronize();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "%d x 32 MiB through %s: %.2f GB/s\n", kStreamed, t.Route(0).c_str(),
                 kStreamed * 32.0 * (1 << 20) / seconds / 1e9);
    absl::Status s = t.Send(0, {MessageTag::Kind::kGrad, 1, 0, 0}, b.Zeros(DType::kBFloat16, {1}));
    STAGE_CHECK(s.ok(), "%s", s.ToString().c_str());
    (void)t.Recv(0, {MessageTag::Kind::kGrad, 1, 0, 0});  // until stage 0 closes
  }
  return 0;
}

// Stage 0 sends an activation whose producer (a chain of ops) is still
// queued, so the inbox copy waits behind it, and is SIGKILLed at once.
// Stage 1 must learn of it - the tensor or an error - and close its
// transport; SIGALRM ends it (exit 128 + 14) if it hangs instead.
int KilledSenderStage(int stage, const std::vector<std::string>& addresses) {
  std::string why;
  if (backend::CudaDeviceCount(&why) == 0) return kSkip;
  absl::StatusOr<std::unique_ptr<backend::Backend>> made = backend::MakeCudaBackend();
  STAGE_CHECK(made.ok(), "%s", made.status().ToString().c_str());
  backend::Backend& b = **made;
  TcpTransportOptions options{.stage = stage, .stages = 2, .addresses = addresses, .job = "kill"};
  options.recv_timeout = absl::Seconds(20);
  absl::StatusOr<std::unique_ptr<TcpTransport>> connected = TcpTransport::Connect(options, b);
  STAGE_CHECK(connected.ok(), "%s", connected.status().ToString().c_str());
  const MessageTag tag{MessageTag::Kind::kActivation, 1, 0, 0};
  if (stage == 0) {
    backend::Tensor x = b.Zeros(DType::kBFloat16, {4096, 4096});
    for (int i = 0; i < 400; ++i) x = b.Add(x, x);
    absl::Status s = (*connected)->Send(1, tag, x);
    STAGE_CHECK(s.ok(), "%s", s.ToString().c_str());
    kill(getpid(), SIGKILL);
  }
  alarm(60);
  absl::StatusOr<backend::Tensor> got = (*connected)->Recv(0, tag);
  std::fprintf(stderr, "stage 1: the killed sender's message: %s\n",
               got.ok() ? "arrived" : got.status().ToString().c_str());
  connected->reset();  // joins the reader
  std::fprintf(stderr, "stage 1: transport closed\n");
  return 0;
}

// Runs `role(stage)` for stages 0 and 1 in child processes; their exit codes.
template <typename Role>
std::vector<int> RunStages(Role role) {
  std::vector<pid_t> children;
  for (int stage = 0; stage < 2; ++stage) {
    const pid_t pid = fork();
    if (pid == 0) _exit(role(stage));
    children.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : children) {
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) {
      codes.push_back(-1);
      continue;
    }
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

std::vector<std::string> TwoAddresses() {
  return {absl::StrCat("127.0.0.1:", zo::testing::FreeLoopbackPort()),
          absl::StrCat("127.0.0.1:", zo::testing::FreeLoopbackPort())};
}

TEST(CudaIpcTransportTest, StageProcessesHandTensorsOverInDeviceMemory) {
  const std::vector<std::string> addresses = TwoAddresses();
  const std::vector<int> codes =
      RunStages([&](int stage) { return RunStage(stage, addresses, /*link=*/false); });
  if (codes[0] == kSkip || codes[1] == kSkip) GTEST_SKIP() << "no CUDA device (see the log)";
  EXPECT_EQ(codes[0], 0) << "stage 0";
  EXPECT_EQ(codes[1], 0) << "stage 1";
}

TEST(CudaIpcTransportTest, StageProcessesOnTwoGpusHandTensorsOverAnNcclLink) {
  const std::vector<std::string> addresses = TwoAddresses();
  const std::vector<int> codes =
      RunStages([&](int stage) { return RunStage(stage, addresses, /*link=*/true); });
  if (codes[0] == kSkip || codes[1] == kSkip) {
    GTEST_SKIP() << "needs two CUDA devices (NCCL refuses two ranks on one GPU)";
  }
  EXPECT_EQ(codes[0], 0) << "stage 0";
  EXPECT_EQ(codes[1], 0) << "stage 1";
}

TEST(CudaIpcTransportTest, StreamsThroughBothRoutes) {
  for (bool share : {true, false}) {
    const std::vector<std::string> addresses = TwoAddresses();
    const std::vector<int> codes =
        RunStages([&](int stage) { return StreamStage(stage, addresses, share); });
    if (codes[0] == kSkip || codes[1] == kSkip) GTEST_SKIP() << "no CUDA device";
    EXPECT_EQ(codes[0], 0) << "stage 0, share " << share;
    EXPECT_EQ(codes[1], 0) << "stage 1, share " << share;
  }
}

TEST(CudaIpcTransportTest, AReceiverOutlivesASenderKilledWithACopyQueued) {
  const std::vector<std::string> addresses = TwoAddresses();
  const std::vector<int> codes =
      RunStages([&](int stage) { return KilledSenderStage(stage, addresses); });
  if (codes[1] == kSkip) GTEST_SKIP() << "no CUDA device";
  EXPECT_EQ(codes[0], 128 + SIGKILL) << "stage 0 should have been killed";
  EXPECT_EQ(codes[1], 0) << "stage 1 (142: it hung and SIGALRM ended it)";
}

}  // namespace
}  // namespace zo::pipeline
