// The data plane's in-process route (rpc/in_process_route.h): a client in
// the server's own process pushes and pulls through OffloadServer::DataRoute
// instead of the gRPC streams. Everything it computes must be bit for bit
// what the gRPC route computes; its waits must end as the streams' do.
#include "rpc/in_process_route.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "common/bf16.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/offload_server.h"
#include "tests/server/least_squares.h"
#include "tests/server/lent_buffers.h"
#include "tests/server/skipped_prefetch.h"
#include "tests/server/training_harness.h"
#include "worker/client/offload_client.h"

namespace zo::testing {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<OffloadServer> StartEmbedded() {
  ServerOptions options;
  options.listen = "";
  absl::StatusOr<std::unique_ptr<OffloadServer>> server = OffloadServer::Start(options);
  EXPECT_THAT(server.status(), IsOk());
  return server.ok() ? *std::move(server) : nullptr;
}

ClientOptions OptionsFor(OffloadServer& server, bool route) {
  ClientOptions options;
  options.channels = {server.InProcessChannel()};
  if (route) options.routes = {server.DataRoute()};
  return options;
}

struct RouteCase {
  const char* name;
  DType dtype;
  int dp;
  bool dpu;
  std::set<int64_t> overflow_steps;
  const char* extra;          // more of the config
  bool client_rates = false;  // zo.client_lr: the worker sets each step's rate
};

void PrintTo(const RouteCase& c, std::ostream* os) { *os << c.name; }

class InProcessRouteTest : public ::testing::TestWithParam<RouteCase> {};

// Trains the same problem twice, once per route, and compares every
// version's weights byte for byte.
TEST_P(InProcessRouteTest, TrainsBitIdenticallyToTheGrpcRoute) {
  const RouteCase& c = GetParam();
  const LeastSquares p = LeastSquares::Make({300, 170, 45}, 30, c.dp, 11);
  const std::string config =
      absl::StrCat(R"({"train_batch_size": )", c.dp, R"(, "gradient_clipping": 0.3,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.02, "weight_decay": 0.01}},
          "zo": {"chunk_elems": 64, )",
                   c.client_rates ? R"("client_lr": true, )" : "", R"("dpu": {"enabled": )",
                   c.dpu ? "true" : "false", R"(, "warmup_steps": 1}})", c.extra, "}");
  constexpr int kSteps = 12;
  std::vector<std::vector<std::vector<float>>> weights(2);  // route, version
  for (int route = 0; route < 2; ++route) {
    std::unique_ptr<OffloadServer> server = StartEmbedded();
    ASSERT_NE(server, nullptr);
    ZO_ASSERT_OK_AND_ASSIGN(auto workers, OpenWorkers(p, c.dtype, "routes", config, {},
                                                      OptionsFor(*server, route == 1)));
    if (c.client_rates) {
      // Over the route a call of its own, not through the channel; a step
      // without them would fail the job.
      for (auto& w : workers) w->set_step_lr([](int64_t step) { return 0.002 * step; });
    }
    ASSERT_THAT(workers[0]->InitWeights(), IsOk());
    for (int s = 1; s <= kSteps; ++s) {
      ASSERT_THAT(RunSteps(workers, s, s, c.overflow_steps), IsOk());
      // Without DPU version s is the only one held once made; with DPU the
      // one before it is what the next step computes on.
      ZO_ASSERT_OK_AND_ASSIGN(std::vector<float> x, workers[0]->PullAll(c.dpu ? s - 1 : s));
      weights[route].push_back(std::move(x));
    }
    workers.clear();
    server->Shutdown(absl::Seconds(1));
  }
  ASSERT_EQ(weights[0].size(), weights[1].size());
  for (size_t v = 0; v < weights[0].size(); ++v) {
    ASSERT_EQ(weights[0][v].size(), weights[1][v].size());
    EXPECT_EQ(std::memcmp(weights[0][v].data(), weights[1][v].data(),
                          weights[0][v].size() * sizeof(float)),
              0)
        << "version " << v;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, InProcessRouteTest,
    ::testing::Values(
        RouteCase{"fp32_dp2", DType::kFloat32, 2, false, {}, ""},
        RouteCase{"fp16_overflow",
                  DType::kFloat16,
                  1,
                  false,
                  {3, 7},
                  R"(, "fp16": {"enabled": true, "initial_scale_power": 12})"},
        RouteCase{"bf16_dpu", DType::kBFloat16, 1, true, {}, R"(, "bf16": {"enabled": true})"},
        RouteCase{"bf16_dp2_dpu", DType::kBFloat16, 2, true, {}, R"(, "bf16": {"enabled": true})"},
        RouteCase{"fp32_dp2_client_rates", DType::kFloat32, 2, false, {}, "", true}),
    [](const ::testing::TestParamInfo<RouteCase>& info) { return std::string(info.param.name); });

// A piece for the step after its chunk's (the delayed update's overlap) is
// kept by the client, not blocked on: Push returns, the caller may reuse its
// buffer at once, and the piece goes in when the chunk is released. The
// result equals the gRPC route's.
// Gradients written where the embedded server keeps them (PushBuffers) and
// pushed from there are what the gRPC route sums, step after step; a lent
// tensor pushed from other bytes is copied in as any push.
TEST(InProcessPushBuffersTest, PushesFromTheLentPlacesAreTheGrpcRoutes) {
  std::unique_ptr<OffloadServer> server = StartEmbedded();
  ASSERT_NE(server, nullptr);
  const std::vector<int>& tensors = kLentTensors;
  std::vector<std::unique_ptr<OffloadClient>> clients;
  for (const bool route : {true, false}) {
    ClientOptions options = OptionsFor(*server, route);
    options.job = route ? "lent-route" : "lent-grpc";
    ZO_ASSERT_OK_AND_ASSIGN(clients.emplace_back(),
                            OffloadClient::Open(options, kLentConfig, kLentManifest));
  }
  OffloadClient& lending = *clients[0];
  OffloadClient& grpc = *clients[1];
  EXPECT_THAT(grpc.PushBuffers(1, tensors), IsOkAndHolds(::testing::IsEmpty()))
      << "no in-process route, no buffers";
  constexpr int64_t kSteps = 4;
  int64_t lent_bytes_pushed = 0;
  for (int64_t step = 1; step <= kSteps; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    ZO_ASSERT_OK_AND_ASSIGN(const std::vector<absl::Span<std::byte>> lent,
                            lending.PushBuffers(step, tensors));
    ASSERT_EQ(lent.size(), 3u);
    EXPECT_EQ(lent[0].size(), 5000u * 2);
    EXPECT_TRUE(lent[1].empty());
    EXPECT_EQ(lent[2].size(), 9000u * 2);
    // The last step pushes "c" from its own bytes.
    const bool c_elsewhere = step == kSteps;
    for (int t = 0; t < 3; ++t) {
      const std::vector<uint16_t> g = LentGradient(step, t);
      ASSERT_THAT(grpc.Push(step, t, BytesOf(g)), IsOk());
      if (t == 2 && c_elsewhere) {
        ASSERT_THAT(lending.Push(step, t, BytesOf(g)), IsOk());
        continue;
      }
      std::ranges::copy(BytesOf(g), lent[t].begin());  // "b" is empty: no memcpy of null
      ASSERT_THAT(lending.PushShared(step, t, std::make_shared<int>(0), lent[t]), IsOk());
      lent_bytes_pushed += static_cast<int64_t>(lent[t].size());
    }
    ASSERT_THAT(lending.FinishStep(step), IsOk());
    ASSERT_THAT(grpc.FinishStep(step), IsOk());
    EXPECT_EQ(PulledWeights(lending, step), PulledWeights(grpc, step)) << "version " << step;
  }
  EXPECT_EQ(lending.traffic().pushed_in_place_bytes, lent_bytes_pushed);
}

// What an embedded server does not lend: a step its chunks do not take yet,
// a range already pushed, and jobs that sum several contributors.
TEST(InProcessPushBuffersTest, LendsOnlyWhatOneContributorHasYetToPush) {
  std::unique_ptr<OffloadServer> server = StartEmbedded();
  ASSERT_NE(server, nullptr);
  const std::vector<TensorSpec> manifest = {
      {.name = "a", .shape = {3000}, .dtype = DType::kBFloat16},
      {.name = "b", .shape = {3000}, .dtype = DType::kBFloat16}};
  ClientOptions options = OptionsFor(*server, true);
  options.job = "lend-once";
  ZO_ASSERT_OK_AND_ASSIGN(
      auto client,
      OffloadClient::Open(options, R"({"train_batch_size": 1, "bf16": {"enabled": true},
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "zo": {"chunk_elems": 4096}})",
                          manifest));
  EXPECT_THAT(client->PushBuffers(2, std::vector<int>{0}), IsOkAndHolds(::testing::IsEmpty()))
      << "the job takes step 1";
  std::vector<uint16_t> g(3000, FloatToBf16Bits(0.5f));
  ASSERT_THAT(client->Push(1, 0, {reinterpret_cast<const std::byte*>(g.data()), g.size() * 2}),
              IsOk());
  EXPECT_THAT(client->PushBuffers(1, std::vector<int>{0}), IsOkAndHolds(::testing::IsEmpty()))
      << "a pushed range";
  EXPECT_THAT(client->PushBuffers(1, std::vector<int>{1}), IsOkAndHolds(::testing::SizeIs(1)));
  EXPECT_THAT(client->PushBuffers(0, std::vector<int>{1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("numbered from 1")));

  for (const int dp : {1, 2}) {
    ClientOptions summed = OptionsFor(*server, true);
    summed.job = absl::StrCat("summed-", dp);
    summed.dp_world_size = dp;
    const std::string config =
        dp == 1 ? R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
              "bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
              "zo": {"gradient_accumulation": "servers"}})"
                : R"({"train_batch_size": 2, "bf16": {"enabled": true},
                "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})";
    ZO_ASSERT_OK_AND_ASSIGN(auto other, OffloadClient::Open(summed, config, manifest));
    EXPECT_THAT(other->PushBuffers(1, std::vector<int>{0}), IsOkAndHolds(::testing::IsEmpty()))
        << (dp == 1 ? "micro-batches summed on the server" : "two dp ranks");
  }
}

TEST(InProcessRouteWaitTest, APushForTheNextStepReturnsAndGoesInWhenItsChunkIsFree) {
  const std::string config = R"({"train_batch_size": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
      "bf16": {"enabled": true}, "zo": {"dpu": {"enabled": true, "warmup_steps": 0}}})";
  std::vector<std::vector<std::byte>> results;
  for (int route = 0; route < 2; ++route) {
    std::unique_ptr<OffloadServer> server = StartEmbedded();
    ASSERT_NE(server, nullptr);
    ClientOptions options = OptionsFor(*server, route == 1);
    options.job = "ahead";
    ZO_ASSERT_OK_AND_ASSIGN(auto client,
                            OffloadClient::Open(options, config, {{"w", {64}, DType::kBFloat16}}));
    std::vector<uint16_t> g(64);
    for (int i = 0; i < 64; ++i) g[i] = FloatToBf16Bits(0.01f * static_cast<float>(i + 1));
    const absl::Span<const std::byte> bytes = {reinterpret_cast<const std::byte*>(g.data()), 128};
    // Step 2 first: its chunk still takes step 1.
    ASSERT_THAT(client->Push(2, 0, bytes), IsOk());
    if (route == 1) {  // a stream's piece may not have reached the server yet
      ZO_ASSERT_OK_AND_ASSIGN(v1::JobStatus status, client->JobStatus());
      EXPECT_EQ(status.waiting_pushes(), 1);
    }
    const std::vector<uint16_t> step2 = g;
    // The caller's buffer is its own again: step 1's gradient goes in it.
    for (uint16_t& h : g) h = FloatToBf16Bits(-0.02f);
    ASSERT_THAT(client->Push(1, 0, bytes), IsOk());
    ASSERT_THAT(client->FinishStep(1), IsOk());
    ASSERT_THAT(client->FinishStep(2), IsOk());
    std::vector<std::byte> w(128);
    const std::vector<absl::Span<std::byte>> dst = {absl::MakeSpan(w)};
    ASSERT_THAT(client->Pull(2, -1, {0}, dst).status(), IsOk());
    results.push_back(w);
    // Step 2's update used its own gradient, not what the buffer held later.
    EXPECT_NE(step2, g);
    client.reset();
    server->Shutdown(absl::Seconds(1));
  }
  EXPECT_EQ(results[0], results[1]);
}

// Pushes big enough to be cut into parts copied by several threads, and a
// pull read by several: two ranks summing on the server and one rank whose
// gradients are kept as received, both against the gRPC route.
TEST(InProcessRouteWaitTest, BigPushesAndPullsInPartsGiveTheGrpcRoutesBits) {
  constexpr int64_t kElems = (int64_t{9} << 20) + 3;  // past several 4 MiB parts
  for (const int dp : {1, 2}) {
    const std::string config =
        absl::StrCat(R"({"train_batch_size": )", dp, R"(, "bf16": {"enabled": true},
            "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
            "zo": {"chunk_elems": 6000000}})");
    std::vector<std::vector<std::byte>> results;
    for (int route = 0; route < 2; ++route) {
      std::unique_ptr<OffloadServer> server = StartEmbedded();
      ASSERT_NE(server, nullptr);
      std::vector<std::unique_ptr<OffloadClient>> ranks;
      for (int r = 0; r < dp; ++r) {
        ClientOptions options = OptionsFor(*server, route == 1);
        options.job = "big";
        options.dp_rank = r;
        options.dp_world_size = dp;
        ZO_ASSERT_OK_AND_ASSIGN(
            auto c, OffloadClient::Open(options, config, {{"w", {kElems}, DType::kBFloat16}}));
        ranks.push_back(std::move(c));
      }
      std::vector<uint16_t> g(kElems);
      for (int step = 1; step <= 2; ++step) {
        for (int r = 0; r < dp; ++r) {
          for (int64_t i = 0; i < kElems; ++i) {
            g[i] = FloatToBf16Bits(1e-3f * static_cast<float>((i * 31 + r * 7 + step) % 101 - 50));
          }
          ASSERT_THAT(
              ranks[r]->Push(step, 0, {reinterpret_cast<const std::byte*>(g.data()), g.size() * 2}),
              IsOk());
        }
        for (int r = 0; r < dp; ++r) ASSERT_THAT(ranks[r]->FinishStep(step), IsOk());
      }
      std::vector<std::byte> w(kElems * 2);
      const std::vector<absl::Span<std::byte>> dst = {absl::MakeSpan(w)};
      ASSERT_THAT(ranks[0]->Pull(2, -1, {0}, dst).status(), IsOk());
      results.push_back(std::move(w));
      ranks.clear();
      server->Shutdown(absl::Seconds(1));
    }
    EXPECT_TRUE(results[0] == results[1]) << "dp " << dp;
  }
}

// A chunk that fills while others are still pushed is speculated on one
// worker a slice at a time, and on every worker from the moment the last
// gradient is in: the weights are the bits of the job without speculation.
TEST(InProcessRouteWaitTest, AChunkSpeculatedInSlicesBesideThePushesIsTheUpdateWithoutIt) {
  constexpr int64_t kChunk = 600000;  // more than two slices of 256 Ki elements
  std::unique_ptr<OffloadServer> server = StartEmbedded();
  ASSERT_NE(server, nullptr);
  std::vector<std::unique_ptr<OffloadClient>> clients;
  for (const bool speculative : {true, false}) {
    ClientOptions options = OptionsFor(*server, true);
    options.job = speculative ? "sliced" : "plain";
    ZO_ASSERT_OK_AND_ASSIGN(
        auto c, OffloadClient::Open(
                    options,
                    absl::StrCat(R"({"train_batch_size": 1, "bf16": {"enabled": true},
                      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}},
                      "zo": {"chunk_elems": )",
                                 kChunk, R"(, "speculative_update": )",
                                 speculative ? "true" : "false", "}}"),
                    {{"a", {kChunk}, DType::kBFloat16}, {"b", {kChunk}, DType::kBFloat16}}));
    clients.push_back(std::move(c));
  }
  OffloadClient& sliced = *clients[0];
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus opened, sliced.JobStatus());
  ASSERT_EQ(opened.no_speculation(), "");
  std::vector<uint16_t> g(kChunk);
  const absl::Span<const std::byte> bytes = {reinterpret_cast<const std::byte*>(g.data()),
                                             g.size() * 2};
  std::vector<std::vector<std::byte>> w(2, std::vector<std::byte>(kChunk * 2 * 2));
  for (int step = 1; step <= 3; ++step) {
    for (size_t c = 0; c < clients.size(); ++c) {
      ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus before, clients[c]->JobStatus());
      for (int t = 0; t < 2; ++t) {
        for (int64_t i = 0; i < kChunk; ++i) {
          g[i] = FloatToBf16Bits(1e-3f * static_cast<float>((i * 17 + t * 5 + step) % 61 - 30));
        }
        ASSERT_THAT(clients[c]->Push(step, t, bytes), IsOk());
        if (c != 0 || t != 0) continue;
        // Chunk 0 is speculated while chunk 1 is still to come.
        ASSERT_TRUE(JobStatusUntil(*clients[c],
                                   [&](const v1::JobStatus& st) {
                                     return st.speculated_chunks() > before.speculated_chunks();
                                   }))
            << "step " << step << ": chunk 0 was never speculated";
      }
      ASSERT_THAT(clients[c]->FinishStep(step), IsOk());
      const std::vector<absl::Span<std::byte>> dst = {absl::MakeSpan(w[c]).subspan(0, kChunk * 2),
                                                      absl::MakeSpan(w[c]).subspan(kChunk * 2)};
      ASSERT_THAT(clients[c]->Pull(step, -1, {0, 1}, dst).status(), IsOk());
    }
    EXPECT_TRUE(w[0] == w[1]) << "version " << step << " differs";
  }
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus after, sliced.JobStatus());
  EXPECT_EQ(after.confirmed_chunks(), after.speculated_chunks());
  EXPECT_GE(after.speculated_chunks(), 3);
  clients.clear();
  server->Shutdown(absl::Seconds(1));
}

// The update writes the pulled weights as it goes (or the pull reads them
// as the update does its tiles), but a pull answers only once its version is
// the job's: a status asked right after it shows that version.
TEST(InProcessRouteWaitTest, APulledVersionIsTheJobsWhenThePullReturns) {
  constexpr int64_t kElems = int64_t{1} << 20;  // many of the update's tiles
  std::unique_ptr<OffloadServer> server = StartEmbedded();
  ASSERT_NE(server, nullptr);
  ClientOptions options = OptionsFor(*server, true);
  options.job = "published";
  ZO_ASSERT_OK_AND_ASSIGN(
      auto client,
      OffloadClient::Open(options, R"({"train_batch_size": 1, "bf16": {"enabled": true},
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})",
                          {{"w", {kElems}, DType::kBFloat16}}));
  std::vector<uint16_t> g(kElems);
  std::vector<std::byte> w(kElems * 2);
  const std::vector<absl::Span<std::byte>> dst = {absl::MakeSpan(w)};
  for (int step = 1; step <= 12; ++step) {
    for (int64_t i = 0; i < kElems; ++i) {
      g[i] = FloatToBf16Bits(1e-3f * static_cast<float>((i * 13 + step) % 71 - 35));
    }
    ASSERT_THAT(client->Push(step, 0, {reinterpret_cast<const std::byte*>(g.data()), kElems * 2}),
                IsOk());
    ASSERT_THAT(client->FinishStep(step), IsOk());
    ASSERT_THAT(client->Pull(step, -1, {0}, dst).status(), IsOk());
    ZO_ASSERT_OK_AND_ASSIGN(v1::JobStatus status, client->JobStatus());
    ASSERT_EQ(status.version(), step);
    ASSERT_EQ(status.applied_steps(), step);
  }
  client.reset();
  server->Shutdown(absl::Seconds(1));
}

// Gradients lent (PushLent) are read where the caller keeps them: kept
// while their chunk can still be updated, let go by the time the step's
// version is pulled, and bit for bit the gRPC route's weights. Tensors
// start and end inside the update's gradient blocks, chunks hold several
// blocks, and clipping is active on some steps (the statistics read the
// lent blocks too). With a delayed update the bytes are copied as ever.
TEST(InProcessLentPushTest, LentGradientsAreTheGrpcRoutesBitsAndLetGoOnceTheVersionIsPulled) {
  const std::vector<TensorSpec>& manifest = kBlockManifest;
  const std::string config = R"({"train_batch_size": 1, "bf16": {"enabled": true},
      "gradient_clipping": 2.0, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
      "zo": {"chunk_elems": 262144}})";
  std::unique_ptr<OffloadServer> server = StartEmbedded();
  ASSERT_NE(server, nullptr);
  std::vector<std::unique_ptr<OffloadClient>> clients;
  for (const bool route : {true, false}) {
    ClientOptions options = OptionsFor(*server, route);
    options.job = route ? "lending" : "grpc";
    ZO_ASSERT_OK_AND_ASSIGN(clients.emplace_back(), OffloadClient::Open(options, config, manifest));
  }
  OffloadClient& lending = *clients[0];
  OffloadClient& grpc = *clients[1];
  for (int64_t step = 1; step <= 4; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    // Large gradients on odd steps: clipped; small ones on even steps.
    const float scale = step % 2 == 1 ? 1.0f : 1e-4f;
    std::vector<std::weak_ptr<std::vector<uint16_t>>> kept;
    for (int t = 0; t < 3; ++t) {
      auto g = std::make_shared<std::vector<uint16_t>>(BlockGradient(step, t, scale));
      const absl::Span<const std::byte> bytes = BytesOf(*g);
      ASSERT_THAT(grpc.Push(step, t, bytes), IsOk());
      kept.push_back(g);
      ASSERT_THAT(lending.PushLent(step, t, std::move(g), bytes), IsOk());
      if (t == 0) {
        EXPECT_FALSE(kept[0].expired())
            << "the server reads a's whole blocks in place: its chunk awaits b";
      }
    }
    ASSERT_THAT(lending.FinishStep(step), IsOk());
    ASSERT_THAT(grpc.FinishStep(step), IsOk());
    EXPECT_EQ(PulledTensors(lending, step, manifest), PulledTensors(grpc, step, manifest));
    for (int t = 0; t < 3; ++t) EXPECT_TRUE(kept[t].expired()) << "tensor " << t;
  }

  ClientOptions options = OptionsFor(*server, true);
  options.job = "delayed";
  ZO_ASSERT_OK_AND_ASSIGN(
      auto delayed,
      OffloadClient::Open(options, R"({"train_batch_size": 1, "bf16": {"enabled": true},
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
          "zo": {"chunk_elems": 262144, "dpu": {"enabled": true}}})",
                          manifest));
  auto g = std::make_shared<std::vector<uint16_t>>(BlockGradient(1, 0, 1.0f));
  const std::weak_ptr<std::vector<uint16_t>> kept = g;
  const absl::Span<const std::byte> bytes = BytesOf(*g);
  ASSERT_THAT(delayed->PushLent(1, 0, std::move(g), bytes), IsOk());
  EXPECT_TRUE(kept.expired()) << "copied: the worker's next step may write its buffers";
  clients.clear();
  delayed.reset();
  server->Shutdown(absl::Seconds(1));
}

// A prefetch written ahead by a speculation of a step then skipped holds
// the version when it returns (tests/server/skipped_prefetch.h).
TEST(InProcessRouteWaitTest, APrefetchWrittenAheadOfASkippedStepHoldsTheVersion) {
  std::unique_ptr<OffloadServer> server = StartEmbedded();
  ASSERT_NE(server, nullptr);
  ClientOptions options = OptionsFor(*server, true);
  options.job = "skipped";
  ZO_ASSERT_OK_AND_ASSIGN(auto client,
                          OffloadClient::Open(options, kSkippedConfig, kSkippedManifest));
  std::vector<std::byte> w(kSkippedElems * 2);
  PrefetchAcrossASkippedStep(*client, absl::MakeSpan(w));
  client.reset();
  server->Shutdown(absl::Seconds(1));
}

// A pull waiting on the route for a version that will not come ends with
// DEADLINE_EXCEEDED at the call's timeout (EmbeddedPullCancelTest covers
// its cancellation).
TEST(InProcessRouteWaitTest, AWaitingPullEndsAtItsDeadline) {
  std::unique_ptr<OffloadServer> server = StartEmbedded();
  ASSERT_NE(server, nullptr);
  ClientOptions options = OptionsFor(*server, true);
  options.job = "waits";
  options.call_timeout = absl::Milliseconds(100);
  options.retry_for = absl::ZeroDuration();
  ZO_ASSERT_OK_AND_ASSIGN(
      auto client, OffloadClient::Open(options, R"({"train_batch_size": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})",
                                       {{.name = "w", .shape = {8}, .dtype = DType::kFloat32}}));
  std::vector<std::byte> w(8 * sizeof(float));
  const std::vector<absl::Span<std::byte>> dst = {absl::MakeSpan(w)};
  EXPECT_THAT(client->Pull(1, -1, {0}, dst).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("did not exist within")));
  ZO_ASSERT_OK_AND_ASSIGN(v1::JobStatus after, client->JobStatus());
  EXPECT_EQ(after.waiting_pulls(), 0);
  // The pull had registered its buffer for the update to write; given up,
  // it is the caller's again: the update that comes now leaves it alone.
  std::fill(w.begin(), w.end(), std::byte{0x5a});
  std::vector<float> g(8, 0.5f);
  ASSERT_THAT(client->Push(1, 0, {reinterpret_cast<const std::byte*>(g.data()), 32}), IsOk());
  ASSERT_THAT(client->FinishStep(1), IsOk());
  std::vector<std::byte> pulled(8 * sizeof(float));
  const std::vector<absl::Span<std::byte>> into = {absl::MakeSpan(pulled)};
  ASSERT_THAT(client->Pull(1, -1, {0}, into).status(), IsOk());
  EXPECT_EQ(w, std::vector<std::byte>(w.size(), std::byte{0x5a}));
  client.reset();
  server->Shutdown(absl::Seconds(1));
}

// The route's own checks: a stale incarnation is refused saying where the
// job is, and after the server stops every call is UNAVAILABLE.
TEST(InProcessRouteWaitTest, StaleCallsAndAStoppedServerAreRefused) {
  std::unique_ptr<OffloadServer> server = StartEmbedded();
  ASSERT_NE(server, nullptr);
  std::shared_ptr<InProcessRoute> route = server->DataRoute();
  ClientOptions options = OptionsFor(*server, true);
  options.job = "stale";
  ZO_ASSERT_OK_AND_ASSIGN(
      auto client, OffloadClient::Open(options, R"({"train_batch_size": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})",
                                       {{.name = "w", .shape = {8}, .dtype = DType::kFloat32}}));
  ZO_ASSERT_OK_AND_ASSIGN(v1::JobStatus status, client->JobStatus());
  v1::GradientPiece header;
  header.set_job("stale");
  header.set_step(1);
  header.set_dtype(v1::DTYPE_FP32);
  header.set_incarnation(status.incarnation() + 1);
  std::vector<float> g(8, 1.0f);
  const absl::Span<const std::byte> bytes = {reinterpret_cast<const std::byte*>(g.data()), 32};
  InProcessRoute::PushWait wait;
  EXPECT_THAT(route
                  ->TryPush(
                      header, bytes, &wait, [] {}, nullptr)
                  .status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("moved to servers")));
  header.set_incarnation(status.incarnation());
  header.set_chunk(5);  // the job has one chunk
  EXPECT_THAT(route
                  ->TryPush(
                      header, bytes, &wait, [] {}, nullptr)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  v1::StepLrRequest rates;
  rates.set_job("stale");
  rates.set_step(1);
  rates.add_group_lr(0.01);
  rates.set_incarnation(status.incarnation() + 1);
  EXPECT_THAT(route->SetStepLr(rates),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("moved to servers")));
  ZO_ASSERT_OK_AND_ASSIGN(v1::JobStatus unchanged, client->JobStatus());
  EXPECT_EQ(unchanged.version(), 0);
  EXPECT_EQ(unchanged.waiting_pushes(), 0);

  client.reset();
  server->Shutdown(absl::Seconds(1));
  header.set_chunk(0);
  EXPECT_THAT(route
                  ->TryPush(
                      header, bytes, &wait, [] {}, nullptr)
                  .status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shut down")));
  rates.set_incarnation(status.incarnation());
  EXPECT_THAT(route->SetStepLr(rates),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shut down")));
  v1::PullParamsRequest request;
  request.set_job("stale");
  EXPECT_THAT(route
                  ->PullInto(request,
                             [](const InProcessRoute::PulledRange&) {
                               return absl::StatusOr<std::byte*>(nullptr);
                             })
                  .status(),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

}  // namespace
}  // namespace zo::testing
