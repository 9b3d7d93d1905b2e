// The embedded default: an OffloadServer in the worker's own process, no
// socket, the same client API over an in-process channel.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "rpc/in_process_route.h"
#include "server/offload_server.h"
#include "tests/server/least_squares.h"
#include "tests/server/training_harness.h"
#include "worker/client/offload_client.h"

namespace zo::testing {
namespace {

using ::testing::HasSubstr;

TEST(EmbeddedServerTest, InProcessChannelTrainsToTheReference) {
  ServerOptions server_options;
  server_options.listen = "";  // in-process only
  ZO_ASSERT_OK_AND_ASSIGN(auto server, OffloadServer::Start(server_options));
  EXPECT_EQ(server->port(), 0);
  const LeastSquares p = LeastSquares::Make({150, 90}, 40, 1, 5);
  ClientOptions options;
  options.channels = {server->InProcessChannel()};
  const std::string config = R"({"train_batch_size": 1, "gradient_clipping": 0.5,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
      "zo": {"chunk_elems": 64}})";
  ZO_ASSERT_OK_AND_ASSIGN(auto workers,
                          OpenWorkers(p, DType::kFloat32, "embedded", config, {}, options));
  ASSERT_THAT(workers[0]->InitWeights(), IsOk());
  ASSERT_THAT(RunSteps(workers, 1, 20), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<float> x, workers[0]->PullAll(20));
  // PullForStep says whether it wrote new weights: step 21 computes on v20,
  // which a second call for the same step does not fetch again.
  std::vector<std::byte> w(static_cast<size_t>(p.tensor_sizes[0]) * sizeof(float));
  const std::vector<absl::Span<std::byte>> dst = {absl::MakeSpan(w)};
  const std::vector<int> all = {0};
  ZO_ASSERT_OK_AND_ASSIGN(bool fresh, workers[0]->client().PullForStep(21, all, dst));
  EXPECT_TRUE(fresh);
  ZO_ASSERT_OK_AND_ASSIGN(bool again, workers[0]->client().PullForStep(21, all, dst));
  EXPECT_FALSE(again);
  Reference ref(p, {.lr_min = 0.01, .lr_max = 0.01, .clipping = 0.5});
  for (int s = 1; s <= 20; ++s) ref.Step(s, false, 1.0);
  for (int i = 0; i < p.n; ++i) {
    EXPECT_NEAR(x[i], ref.master()[i], 1e-5 * (1 + std::abs(ref.master()[i]))) << i;
  }
  workers.clear();
  server->Shutdown(absl::Seconds(1));
}

// Under DPU a step computes on an older version than the client has seen,
// and its loss must be scaled as that version's steps are: right after an
// overflow the two scales differ.
TEST(EmbeddedServerTest, PullForStepGivesTheLossScaleOfTheVersionTheStepComputesOn) {
  ServerOptions server_options;
  server_options.listen = "";
  ZO_ASSERT_OK_AND_ASSIGN(auto server, OffloadServer::Start(server_options));
  ClientOptions options;
  options.job = "dpu-scale";
  options.channels = {server->InProcessChannel()};
  const std::string config = R"({"train_batch_size": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
      "fp16": {"enabled": true, "initial_scale_power": 16, "hysteresis": 1},
      "zo": {"dpu": {"enabled": true, "warmup_steps": 0}}})";
  ZO_ASSERT_OK_AND_ASSIGN(auto client,
                          OffloadClient::Open(options, config, {{"w", {8}, DType::kFloat16}}));
  std::vector<std::byte> w(16);
  const std::vector<absl::Span<std::byte>> dst = {absl::MakeSpan(w)};
  const std::vector<int> all = {0};
  double scale = 0;
  ZO_ASSERT_OK_AND_ASSIGN(bool fresh, client->PullForStep(1, all, dst, &scale));
  EXPECT_TRUE(fresh);
  EXPECT_EQ(scale, 65536);
  // Step 1 overflows (fp16 inf): skipped, and the scale halves from v1 on.
  const std::vector<uint16_t> inf(8, 0x7C00);
  ASSERT_THAT(client->Push(1, 0, {reinterpret_cast<const std::byte*>(inf.data()), 16}), IsOk());
  ASSERT_THAT(client->FinishStep(1), IsOk());
  ASSERT_THAT(client->Pull(1, -1, all, dst).status(), IsOk());  // waits for v1
  EXPECT_EQ(client->loss_scale(), 32768);
  // Step 2 computes on v0 with DPU: its gradients carry v0's scale.
  ZO_ASSERT_OK_AND_ASSIGN(bool again, client->PullForStep(2, all, dst, &scale));
  EXPECT_FALSE(again);
  EXPECT_EQ(scale, 65536);
  ZO_ASSERT_OK_AND_ASSIGN(bool third, client->PullForStep(3, all, dst, &scale));
  EXPECT_FALSE(third);  // v1 equals v0: step 1 was skipped
  EXPECT_EQ(scale, 32768);
  client.reset();
  server->Shutdown(absl::Seconds(1));
}

// A job of three fp32 tensors a {12}, b {5}, c {20} (37 elements, chunks
// of 8) on an embedded server, through its in-process channel and, with
// `route`, its in-process route.
struct ThreeTensorJob {
  std::unique_ptr<OffloadServer> server;
  std::unique_ptr<OffloadClient> client;

  static absl::StatusOr<ThreeTensorJob> Open(const std::string& job, bool route) {
    ServerOptions server_options;
    server_options.listen = "";
    ThreeTensorJob j;
    ZO_ASSIGN_OR_RETURN(j.server, OffloadServer::Start(server_options));
    ClientOptions options;
    options.job = job;
    options.channels = {j.server->InProcessChannel()};
    if (route) options.routes = {j.server->DataRoute()};
    const std::string config = R"({"train_batch_size": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "zo": {"chunk_elems": 8}})";
    ZO_ASSIGN_OR_RETURN(j.client, OffloadClient::Open(options, config,
                                                      {{"a", {12}, DType::kFloat32},
                                                       {"b", {5}, DType::kFloat32},
                                                       {"c", {20}, DType::kFloat32}}));
    return j;
  }
  // Step `step`'s gradients, the same every step, and its end.
  absl::Status Push(int64_t step) {
    std::vector<float> g(37);
    for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * static_cast<float>(i % 7) - 0.02f;
    const auto* bytes = reinterpret_cast<const std::byte*>(g.data());
    for (const auto& [tensor, from, n] : {std::tuple{0, 0, 12}, {1, 12, 5}, {2, 17, 20}}) {
      ZO_RETURN_IF_ERROR(client->Push(step, tensor, {bytes + from * 4, size_t{4} * n}));
    }
    return client->FinishStep(step);
  }
  ~ThreeTensorJob() {
    client.reset();
    if (server != nullptr) server->Shutdown(absl::Seconds(1));
  }
  ThreeTensorJob() = default;
  ThreeTensorJob(ThreeTensorJob&&) = default;
};

// A streamed stage whose weights live in a file pulls them batch by batch
// through one buffer: each batch is there when the client hands it over, the
// whole equals one pull of everything, and an unchanged version hands over
// nothing.
TEST(EmbeddedServerTest, PullForStepInBatchesHandsOverEachBatchThroughOneBuffer) {
  ZO_ASSERT_OK_AND_ASSIGN(ThreeTensorJob job, ThreeTensorJob::Open("batched", /*route=*/false));
  OffloadClient* client = job.client.get();
  std::vector<float> init(37);
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.1f * static_cast<float>(i) - 1.5f;
  ASSERT_THAT(client->InitParams(0, absl::MakeConstSpan(init).subspan(0, 12)), IsOk());
  ASSERT_THAT(client->InitParams(1, absl::MakeConstSpan(init).subspan(12, 5)), IsOk());
  ASSERT_THAT(client->InitParams(2, absl::MakeConstSpan(init).subspan(17, 20)), IsOk());
  ASSERT_THAT(job.Push(1), IsOk());

  std::vector<std::byte> whole(37 * 4);
  const std::vector<absl::Span<std::byte>> whole_dst = {absl::MakeSpan(whole).subspan(0, 48),
                                                        absl::MakeSpan(whole).subspan(48, 20),
                                                        absl::MakeSpan(whole).subspan(68, 80)};
  ASSERT_THAT(client->Pull(1, -1, {0, 1, 2}, whole_dst).status(), IsOk());

  // Batches {c} then {a, b} through one 80-byte buffer.
  std::vector<std::byte> buffer(80);
  const std::vector<int> first = {2};
  const std::vector<int> second = {0, 1};
  const std::vector<absl::Span<std::byte>> first_dst = {absl::MakeSpan(buffer)};
  const std::vector<absl::Span<std::byte>> second_dst = {absl::MakeSpan(buffer).subspan(0, 48),
                                                         absl::MakeSpan(buffer).subspan(48, 20)};
  const std::vector<OffloadClient::PullBatch> batches = {{first, first_dst}, {second, second_dst}};
  std::vector<std::byte> gathered(37 * 4);
  std::vector<size_t> handed;
  auto pulled = [&](size_t b) {
    handed.push_back(b);
    if (b == 0) std::copy_n(buffer.begin(), 80, gathered.begin() + 68);
    if (b == 1) std::copy_n(buffer.begin(), 68, gathered.begin());
    return absl::OkStatus();
  };
  ZO_ASSERT_OK_AND_ASSIGN(bool changed, client->PullForStepInBatches(2, batches, pulled));
  EXPECT_TRUE(changed);
  EXPECT_EQ(handed, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(gathered, whole);
  EXPECT_NE(std::vector<std::byte>(whole.begin(), whole.begin() + 4),
            std::vector<std::byte>(reinterpret_cast<const std::byte*>(init.data()),
                                   reinterpret_cast<const std::byte*>(init.data()) + 4));

  handed.clear();
  ZO_ASSERT_OK_AND_ASSIGN(bool again, client->PullForStepInBatches(2, batches, pulled));
  EXPECT_FALSE(again);
  EXPECT_TRUE(handed.empty());

  // A failing hand-over ends the pull with its error, and the next call
  // pulls whole again.
  ASSERT_THAT(job.Push(2), IsOk());
  handed.clear();
  EXPECT_THAT(client
                  ->PullForStepInBatches(3, batches,
                                         [](size_t) { return absl::DataLossError("disk gone"); })
                  .status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("disk gone")));
  ZO_ASSERT_OK_AND_ASSIGN(bool retried, client->PullForStepInBatches(3, batches, pulled));
  EXPECT_TRUE(retried);
  EXPECT_EQ(handed, (std::vector<size_t>{0, 1}));
}

// The batches of a pull as written all arrive, together equal to one pull
// of everything, over the in-process route (where each is registered for
// the update to write) and over a channel; `registered` runs once per
// pull; an unchanged version hands over nothing; a failing hand-over ends
// the pull with its error and the next call pulls whole again.
TEST(EmbeddedServerTest, PullForStepAsWrittenHandsOverEveryBatch) {
  for (const bool route : {true, false}) {
    SCOPED_TRACE(route ? "in-process route" : "in-process channel");
    ZO_ASSERT_OK_AND_ASSIGN(ThreeTensorJob job, ThreeTensorJob::Open("as-written", route));
    OffloadClient* client = job.client.get();
    ASSERT_THAT(job.Push(1), IsOk());
    std::vector<std::byte> whole(37 * 4);
    const auto spans = [](std::vector<std::byte>& v) {
      return std::vector<absl::Span<std::byte>>{absl::MakeSpan(v).subspan(0, 48),
                                                absl::MakeSpan(v).subspan(48, 20),
                                                absl::MakeSpan(v).subspan(68, 80)};
    };
    const std::vector<absl::Span<std::byte>> whole_dst = spans(whole);
    ASSERT_THAT(client->Pull(1, -1, {0, 1, 2}, whole_dst).status(), IsOk());

    // Batches {a, b} and {c}, each into its own part of `got`.
    std::vector<std::byte> got(37 * 4);
    const std::vector<absl::Span<std::byte>> got_dst = spans(got);
    const std::vector<int> first = {0, 1}, second = {2};
    const std::vector<OffloadClient::PullBatch> batches = {
        {first, absl::MakeConstSpan(got_dst).subspan(0, 2)},
        {second, absl::MakeConstSpan(got_dst).subspan(2, 1)}};
    std::mutex mu;
    std::set<size_t> handed;
    int registered = 0;
    const auto arrived = [&](size_t b) {
      std::lock_guard lock(mu);
      EXPECT_TRUE(handed.insert(b).second) << "batch " << b << " handed over twice";
      return absl::OkStatus();
    };
    const auto count = [&] {
      std::lock_guard lock(mu);
      ++registered;
    };
    ZO_ASSERT_OK_AND_ASSIGN(bool changed, client->PullForStepAsWritten(2, batches, arrived, count));
    EXPECT_TRUE(changed);
    EXPECT_EQ(handed, (std::set<size_t>{0, 1}));
    EXPECT_EQ(registered, 1);
    EXPECT_EQ(got, whole);

    handed.clear();
    ZO_ASSERT_OK_AND_ASSIGN(bool again, client->PullForStepAsWritten(2, batches, arrived, count));
    EXPECT_FALSE(again);
    EXPECT_TRUE(handed.empty());
    EXPECT_EQ(registered, 2);

    ASSERT_THAT(job.Push(2), IsOk());
    EXPECT_THAT(client
                    ->PullForStepAsWritten(
                        3, batches, [](size_t) { return absl::DataLossError("device gone"); })
                    .status(),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("device gone")));
    handed.clear();
    ZO_ASSERT_OK_AND_ASSIGN(bool retried, client->PullForStepAsWritten(3, batches, arrived));
    EXPECT_TRUE(retried);
    EXPECT_EQ(handed, (std::set<size_t>{0, 1}));
    ASSERT_THAT(client->Pull(2, -1, {0, 1, 2}, whole_dst).status(), IsOk());
    EXPECT_EQ(got, whole);
  }
}

// A client keeps the instance of the job it opened: once the job is closed
// and opened again (a move whose new servers overlap the old ones, a
// restarted server), its pushes and pulls are refused, saying where the job
// is now, instead of landing in a job striped another way.
TEST(EmbeddedServerTest, ACallForAnEarlierInstanceOfTheJobIsRefusedSayingWhereItIs) {
  ServerOptions server_options;
  server_options.listen = "";
  ZO_ASSERT_OK_AND_ASSIGN(auto server, OffloadServer::Start(server_options));
  ClientOptions options;
  options.job = "reopened";
  options.channels = {server->InProcessChannel()};
  const std::string config = R"({"train_batch_size": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})";
  const std::vector<TensorSpec> manifest = {{"w", {8}, DType::kFloat32}};
  ZO_ASSERT_OK_AND_ASSIGN(auto stale, OffloadClient::Open(options, config, manifest));
  ZO_ASSERT_OK_AND_ASSIGN(v1::JobStatus first, stale->JobStatus());
  EXPECT_NE(first.incarnation(), 0u);

  // Closed and opened again by another client.
  {
    auto channel = server->InProcessChannel();
    auto stub = v1::Offload::NewStub(channel);
    grpc::ClientContext context;
    v1::CloseJobRequest close;
    close.set_job("reopened");
    v1::CloseJobResponse closed;
    ASSERT_TRUE(stub->CloseJob(&context, close, &closed).ok());
  }
  ZO_ASSERT_OK_AND_ASSIGN(auto fresh, OffloadClient::Open(options, config, manifest));
  ZO_ASSERT_OK_AND_ASSIGN(v1::JobStatus second, fresh->JobStatus());
  EXPECT_NE(second.incarnation(), first.incarnation());

  std::vector<float> g(8, 1.0f);
  const absl::Status pushed = [&] {
    absl::Status s = stale->Push(1, 0, {reinterpret_cast<const std::byte*>(g.data()), 32});
    return s.ok() ? stale->FinishStep(1) : s;
  }();
  EXPECT_THAT(pushed, StatusIs(absl::StatusCode::kFailedPrecondition,
                               HasSubstr("job reopened moved to servers [inproc:0] at version 0")));
  std::vector<std::byte> w(32);
  const std::vector<absl::Span<std::byte>> dst = {absl::MakeSpan(w)};
  EXPECT_THAT(stale->Pull(0, -1, {0}, dst).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("moved to servers")));
  // The current instance took nothing from the stale client.
  EXPECT_THAT(fresh->Pull(0, -1, {0}, dst).status(), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(v1::JobStatus now, fresh->JobStatus());
  EXPECT_EQ(now.version(), 0);
  EXPECT_EQ(now.waiting_pushes(), 0);
  stale.reset();
  fresh.reset();
  server->Shutdown(absl::Seconds(1));
}

// A pull waiting for a version nobody will make (no gradients come) ends
// with CANCELLED when another thread gives it up; a cancellation already
// given refuses the next pull before it is sent, and the client forgets the
// weights PullForStep left half written.
// Over the in-process channel, and over the data plane's in-process route
// (rpc/in_process_route.h), whose wait has no gRPC context to cancel.
class EmbeddedPullCancelTest : public ::testing::TestWithParam<bool> {};

TEST_P(EmbeddedPullCancelTest, APullWaitingForItsVersionEndsWhenCancelled) {
  ServerOptions server_options;
  server_options.listen = "";
  ZO_ASSERT_OK_AND_ASSIGN(auto server, OffloadServer::Start(server_options));
  ClientOptions options;
  options.job = "cancel";
  options.channels = {server->InProcessChannel()};
  if (GetParam()) options.routes = {server->DataRoute()};
  options.call_timeout = absl::Hours(1);  // only the cancellation can end the wait
  ZO_ASSERT_OK_AND_ASSIGN(
      auto client, OffloadClient::Open(options, R"({"train_batch_size": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})",
                                       {{.name = "w", .shape = {8}, .dtype = DType::kFloat32}}));
  std::vector<std::byte> w(8 * sizeof(float));
  const std::vector<absl::Span<std::byte>> dst = {absl::MakeSpan(w)};
  ZO_ASSERT_OK_AND_ASSIGN(bool first, client->PullForStep(1, {0}, dst));
  EXPECT_TRUE(first);
  PullCancellation cancel;
  absl::StatusOr<bool> pulled;
  std::thread puller([&] { pulled = client->PullForStep(2, {0}, dst, nullptr, &cancel); });
  // The pull is parked on the server before it is cancelled: the job counts it.
  for (;;) {
    ZO_ASSERT_OK_AND_ASSIGN(v1::JobStatus status, client->JobStatus());
    if (status.waiting_pulls() == 1) break;
    std::this_thread::yield();
  }
  cancel.Cancel();
  puller.join();
  EXPECT_THAT(pulled.status(), StatusIs(absl::StatusCode::kCancelled, ::testing::_));
  // The server lets go of it (over the channel its reactor hears of the
  // cancellation after the client does): nothing of it is kept.
  for (;;) {
    ZO_ASSERT_OK_AND_ASSIGN(v1::JobStatus after, client->JobStatus());
    if (after.waiting_pulls() == 0) break;
    std::this_thread::yield();
  }
  EXPECT_THAT(client->Pull(0, -1, {0}, dst, &cancel).status(),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("was cancelled")));
  // dst may hold part of version 1 now: version 0 is pulled again, whole.
  ZO_ASSERT_OK_AND_ASSIGN(bool again, client->PullForStep(1, {0}, dst));
  EXPECT_TRUE(again);
  client.reset();
  server->Shutdown(absl::Seconds(1));
}

INSTANTIATE_TEST_SUITE_P(ChannelAndRoute, EmbeddedPullCancelTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "route" : "channel");
                         });

}  // namespace
}  // namespace zo::testing
