// The data plane's same-host route (server/shared_regions.h): a worker
// beside real zo-server processes moves its gradients and weights through a
// shared-memory region, gRPC carrying only the pieces' headers. What it
// computes must be bit for bit the gRPC route's; a server that cannot map
// the region leaves the worker on gRPC; and no call naming a region can
// read or write outside it, or change a job, when it is wrong.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "rpc/rpc_util.h"
#include "tests/server/least_squares.h"
#include "tests/server/lent_buffers.h"
#include "tests/server/server_process.h"
#include "tests/server/skipped_prefetch.h"
#include "tests/server/training_harness.h"
#include "worker/client/offload_client.h"

namespace zo::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct RouteCase {
  const char* name;
  DType dtype;
  int dp;
  bool dpu;
  std::set<int64_t> overflow_steps;
  const char* extra;
};

void PrintTo(const RouteCase& c, std::ostream* os) { *os << c.name; }

class SharedMemoryRouteTest : public ::testing::TestWithParam<RouteCase> {};

// The same job trained twice on the same two servers, once per route, every
// version compared byte for byte.
TEST_P(SharedMemoryRouteTest, TrainsBitIdenticallyToTheGrpcRoute) {
  const RouteCase& c = GetParam();
  std::vector<ServerProcess> servers = StartServers(2);
  ASSERT_EQ(servers.size(), 2u);
  const LeastSquares p = LeastSquares::Make({300, 170, 45}, 30, c.dp, 7);
  const std::string config =
      absl::StrCat(R"({"train_batch_size": )", c.dp, R"(, "gradient_clipping": 0.3,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.02, "weight_decay": 0.01}},
          "zo": {"chunk_elems": 64, "dpu": {"enabled": )",
                   c.dpu ? "true" : "false", R"(, "warmup_steps": 1}})", c.extra, "}");
  constexpr int kSteps = 10;
  std::vector<std::vector<std::vector<float>>> weights(2);
  for (int shm = 0; shm < 2; ++shm) {
    ClientOptions base;
    base.shared_memory = shm == 1;
    ZO_ASSERT_OK_AND_ASSIGN(auto workers, OpenWorkers(p, c.dtype, absl::StrCat("shm", shm), config,
                                                      Addresses(servers), base));
    for (const auto& w : workers) {
      EXPECT_THAT(w->client().routes(), shm == 1 ? ElementsAre("shared_memory", "shared_memory")
                                                 : ElementsAre("grpc", "grpc"));
    }
    ASSERT_THAT(workers[0]->InitWeights(), IsOk());
    for (int s = 1; s <= kSteps; ++s) {
      ASSERT_THAT(RunSteps(workers, s, s, c.overflow_steps), IsOk());
      ZO_ASSERT_OK_AND_ASSIGN(std::vector<float> x, workers[0]->PullAll(c.dpu ? s - 1 : s));
      weights[shm].push_back(std::move(x));
    }
  }
  for (size_t v = 0; v < weights[0].size(); ++v) {
    ASSERT_EQ(weights[0][v].size(), weights[1][v].size());
    EXPECT_EQ(std::memcmp(weights[0][v].data(), weights[1][v].data(),
                          weights[0][v].size() * sizeof(float)),
              0)
        << "step " << v + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SharedMemoryRouteTest,
    ::testing::Values(
        RouteCase{"bf16_dp2_dpu", DType::kBFloat16, 2, true, {}, R"(, "bf16": {"enabled": true})"},
        RouteCase{"fp16_overflow",
                  DType::kFloat16,
                  1,
                  false,
                  {3, 6},
                  R"(, "fp16": {"enabled": true, "initial_scale_power": 12})"},
        RouteCase{"fp32_dp2", DType::kFloat32, 2, false, {}, ""}),
    [](const ::testing::TestParamInfo<RouteCase>& info) { return std::string(info.param.name); });

// A server that takes no shared memory leaves the worker on gRPC, and it
// trains.
TEST(SharedMemoryFallbackTest, AServerThatCannotMapTheRegionGetsGrpc) {
  std::vector<ServerProcess> servers = StartServers(1, {"--shared-memory=false"});
  ASSERT_EQ(servers.size(), 1u);
  const LeastSquares p = LeastSquares::Make({200}, 20, 1, 3);
  ZO_ASSERT_OK_AND_ASSIGN(auto workers,
                          OpenWorkers(p, DType::kFloat32, "fallback", R"({"train_batch_size": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})",
                                      Addresses(servers)));
  EXPECT_THAT(workers[0]->client().routes(), ElementsAre("grpc"));
  ASSERT_THAT(workers[0]->InitWeights(), IsOk());
  ASSERT_THAT(RunSteps(workers, 1, 3), IsOk());
}

// A job whose region would be larger than the client allows stays on gRPC.
TEST(SharedMemoryFallbackTest, ARegionOverItsCapIsNotMade) {
  std::vector<ServerProcess> servers = StartServers(1);
  ASSERT_EQ(servers.size(), 1u);
  const LeastSquares p = LeastSquares::Make({200}, 20, 1, 3);
  ClientOptions base;
  base.max_region_bytes = 3 * 200 * 4 - 1;  // one byte short
  ZO_ASSERT_OK_AND_ASSIGN(auto workers,
                          OpenWorkers(p, DType::kFloat32, "capped", R"({"train_batch_size": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})",
                                      Addresses(servers), base));
  EXPECT_THAT(workers[0]->client().routes(), ElementsAre("grpc"));
  base.max_region_bytes = 3 * 200 * 4;
  ZO_ASSERT_OK_AND_ASSIGN(auto fits,
                          OpenWorkers(p, DType::kFloat32, "fits", R"({"train_batch_size": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})",
                                      Addresses(servers), base));
  EXPECT_THAT(fits[0]->client().routes(), ElementsAre("shared_memory"));
}

// zo.gradient_accumulation "servers": each micro-batch pushes its own
// gradient, back to back here, as a streaming worker's backward does. The
// servers sum exactly what was pushed, on the same host as over gRPC: a
// micro-batch must never overwrite one the server has not summed yet (the
// region's credits). 4 MiB a piece, so that the server is still summing
// one when the next is ready to be written (without the credits this
// failed 5 of 5 runs).
TEST(SharedMemoryMicroBatchTest, EveryMicroBatchIsSummedAsPushed) {
  std::vector<ServerProcess> servers = StartServers(1);
  ASSERT_EQ(servers.size(), 1u);
  constexpr int64_t kElems = 1 << 20;  // 4 MiB a push: the server takes a while to sum one
  constexpr int kMicroBatches = 4;
  constexpr int kSteps = 4;
  const std::string config = absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": )", kMicroBatches,
      R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
          "zo": {"chunk_elems": 65536, "gradient_accumulation": "servers"}})");
  const std::vector<TensorSpec> manifest = {
      {.name = "w", .shape = {kElems}, .dtype = DType::kFloat32}};
  std::vector<std::vector<float>> weights(2);
  for (int shm = 0; shm < 2; ++shm) {
    ClientOptions options;
    options.job = absl::StrCat("micro-batches-", shm);
    options.servers = Addresses(servers);
    options.shared_memory = shm == 1;
    ZO_ASSERT_OK_AND_ASSIGN(std::unique_ptr<OffloadClient> client,
                            OffloadClient::Open(options, config, manifest));
    EXPECT_THAT(client->routes(), ElementsAre(shm == 1 ? "shared_memory" : "grpc"));
    for (int64_t step = 1; step <= kSteps; ++step) {
      for (int mb = 0; mb < kMicroBatches; ++mb) {
        // Every micro-batch's gradient differs from the others'.
        auto g = std::make_shared<std::vector<float>>(kElems);
        for (int64_t i = 0; i < kElems; ++i) {
          (*g)[static_cast<size_t>(i)] =
              static_cast<float>((i * 7 + mb * 13 + step) % 101 - 50) * 1e-3f * (mb + 1);
        }
        const absl::Span<const std::byte> bytes(reinterpret_cast<const std::byte*>(g->data()),
                                                g->size() * sizeof(float));
        ASSERT_THAT(client->PushShared(step, 0, g, bytes, mb), IsOk());
      }
      ASSERT_THAT(client->FinishStep(step), IsOk());
    }
    std::vector<std::byte> out(kElems * sizeof(float));
    std::vector<absl::Span<std::byte>> dst = {absl::MakeSpan(out)};
    ASSERT_THAT(client->Pull(kSteps, -1, {0}, dst).status(), IsOk());
    weights[shm].resize(kElems);
    std::memcpy(weights[shm].data(), out.data(), out.size());
  }
  EXPECT_EQ(std::memcmp(weights[0].data(), weights[1].data(), kElems * sizeof(float)), 0)
      << "the same-host route summed other gradients than gRPC";
}

// Clients of kLentManifest's jobs `shm_job` through the shared region and
// `grpc_job` over gRPC only, in that order (empty when one fails to open).
std::vector<std::unique_ptr<OffloadClient>> OpenBothRoutes(
    const std::vector<ServerProcess>& servers, const std::string& shm_job,
    const std::string& grpc_job) {
  std::vector<std::unique_ptr<OffloadClient>> clients;
  for (const bool shm : {true, false}) {
    ClientOptions options;
    options.job = shm ? shm_job : grpc_job;
    options.servers = Addresses(servers);
    options.shared_memory = shm;
    absl::StatusOr<std::unique_ptr<OffloadClient>> client =
        OffloadClient::Open(options, kLentConfig, kLentManifest);
    EXPECT_THAT(client.status(), IsOk());
    if (!client.ok()) return {};
    clients.push_back(*std::move(client));
  }
  return clients;
}

// Pulls into the buffers RegionPullBuffers lends read the weights where the
// server wrote them; the bytes are the gRPC route's, and a pull into other
// buffers afterwards cannot change what the lent ones hold.
TEST(SharedMemoryPullBuffersTest, PullsIntoTheRegionAreTheGrpcRoutesAndNothingElseWritesThere) {
  std::vector<ServerProcess> servers = StartServers(1);
  ASSERT_EQ(servers.size(), 1u);
  const std::vector<TensorSpec>& manifest = kLentManifest;
  const std::vector<int> tensors = {0, 1, 2};
  // Both clients of one job: the second only pulls.
  const std::vector<std::unique_ptr<OffloadClient>> clients =
      OpenBothRoutes(servers, "pull-buffers", "pull-buffers");
  ASSERT_EQ(clients.size(), 2u);
  OffloadClient& shm = *clients[0];
  OffloadClient& grpc = *clients[1];
  const std::vector<absl::Span<std::byte>> lent = shm.RegionPullBuffers(tensors);
  ASSERT_EQ(lent.size(), 3u);
  EXPECT_EQ(lent[0].size(), 5000u * 2);
  EXPECT_TRUE(lent[1].empty());
  EXPECT_EQ(lent[2].size(), 9000u * 2);
  EXPECT_TRUE(grpc.RegionPullBuffers(tensors).empty()) << "no region, no buffers";

  auto own_buffers = [&] {
    std::vector<std::vector<std::byte>> bytes;
    for (const TensorSpec& t : manifest)
      bytes.emplace_back(static_cast<size_t>(NumElements(t.shape)) * 2);
    return bytes;
  };
  auto spans = [](std::vector<std::vector<std::byte>>& bytes) {
    std::vector<absl::Span<std::byte>> s;
    for (auto& b : bytes) s.push_back(absl::MakeSpan(b));
    return s;
  };
  auto push_step = [&](int64_t step) {
    for (int t = 0; t < 3; ++t) {
      std::vector<uint16_t> g(static_cast<size_t>(NumElements(manifest[t].shape)));
      for (size_t i = 0; i < g.size(); ++i) {
        g[i] = FloatToBf16Bits(static_cast<float>((i * 7 + step * 3 + t) % 19) - 9.0f);
      }
      ASSERT_THAT(shm.Push(step, t, {reinterpret_cast<const std::byte*>(g.data()), g.size() * 2}),
                  IsOk());
    }
    ASSERT_THAT(shm.FinishStep(step), IsOk());
  };
  auto lent_copy = [&] {
    std::vector<std::vector<std::byte>> bytes;
    for (const auto& b : lent) bytes.emplace_back(b.begin(), b.end());
    return bytes;
  };
  for (int64_t step = 1; step <= 3; ++step) {
    push_step(step);
    ZO_ASSERT_OK_AND_ASSIGN(const bool changed, shm.Pull(step, -1, tensors, lent));
    EXPECT_TRUE(changed);
    auto reference = own_buffers();
    ASSERT_THAT(grpc.Pull(step, -1, tensors, spans(reference)).status(), IsOk());
    EXPECT_EQ(lent_copy(), reference) << "version " << step << " pulled into the region";
  }
  // Version 4 into the client's other buffers: over gRPC, and the lent
  // buffers keep version 3.
  const auto version_3 = lent_copy();
  push_step(4);
  auto other = own_buffers();
  ASSERT_THAT(shm.Pull(4, -1, tensors, spans(other)).status(), IsOk());
  EXPECT_EQ(lent_copy(), version_3) << "a pull into other buffers wrote the lent ones";
  auto reference = own_buffers();
  ASSERT_THAT(grpc.Pull(4, -1, tensors, spans(reference)).status(), IsOk());
  EXPECT_EQ(other, reference);
  EXPECT_NE(other, version_3);
  ASSERT_THAT(shm.Pull(4, -1, tensors, lent).status(), IsOk());
  EXPECT_EQ(lent_copy(), reference);
}

// Tensors large enough that the client's copies into the region and out of
// it bypass the cache (StreamCopy), at odd element counts and offsets: the
// weights are the gRPC route's, step after step.
TEST(SharedMemoryPullBuffersTest, LargeTensorsCopiedPastTheCacheAreTheGrpcRoutes) {
  std::vector<ServerProcess> servers = StartServers(1);
  ASSERT_EQ(servers.size(), 1u);
  const std::vector<TensorSpec> manifest = {
      {.name = "a", .shape = {300001}, .dtype = DType::kBFloat16},
      {.name = "b", .shape = {3}, .dtype = DType::kBFloat16},
      {.name = "c", .shape = {170000}, .dtype = DType::kBFloat16}};
  const std::string config = R"({"train_batch_size": 1, "bf16": {"enabled": true},
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "zo": {"chunk_elems": 131072}})";
  std::vector<std::unique_ptr<OffloadClient>> clients;
  for (const bool shm : {true, false}) {
    ClientOptions options;
    options.job = shm ? "big-shm" : "big-grpc";
    options.servers = Addresses(servers);
    options.shared_memory = shm;
    ZO_ASSERT_OK_AND_ASSIGN(auto c, OffloadClient::Open(options, config, manifest));
    clients.push_back(std::move(c));
  }
  ASSERT_THAT(clients[0]->routes(), ElementsAre("shared_memory"));
  std::vector<std::vector<std::vector<std::byte>>> pulled(2);
  for (int64_t step = 1; step <= 3; ++step) {
    for (size_t c = 0; c < clients.size(); ++c) {
      for (int t = 0; t < 3; ++t) {
        std::vector<uint16_t> g(static_cast<size_t>(NumElements(manifest[t].shape)));
        for (size_t i = 0; i < g.size(); ++i) {
          g[i] = FloatToBf16Bits(1e-3f * static_cast<float>((i * 13 + step * 5 + t) % 41 - 20));
        }
        ASSERT_THAT(
            clients[c]->Push(step, t, {reinterpret_cast<const std::byte*>(g.data()), g.size() * 2}),
            IsOk());
      }
      ASSERT_THAT(clients[c]->FinishStep(step), IsOk());
      // Into the client's own buffers, one byte past an aligned start.
      std::vector<std::byte> buffer(1 + (300001 + 3 + 170000) * 2);
      std::vector<absl::Span<std::byte>> dst;
      size_t at = 1;
      for (const TensorSpec& t : manifest) {
        const size_t n = static_cast<size_t>(NumElements(t.shape)) * 2;
        dst.push_back(absl::MakeSpan(buffer).subspan(at, n));
        at += n;
      }
      ASSERT_THAT(clients[c]->Pull(step, -1, {0, 1, 2}, dst).status(), IsOk());
      pulled[c].push_back(std::move(buffer));
    }
    EXPECT_TRUE(pulled[0].back() == pulled[1].back()) << "version " << step << " differs";
  }
  EXPECT_FALSE(pulled[1].front() == pulled[1].back()) << "the weights never moved";
  // And the bytes where the server wrote them: version 3 pulled into the
  // region's own places (nothing copied on this side) is what was copied out.
  const std::vector<absl::Span<std::byte>> lent = clients[0]->RegionPullBuffers({0, 1, 2});
  ASSERT_EQ(lent.size(), 3u);
  ASSERT_THAT(clients[0]->Pull(3, -1, {0, 1, 2}, lent).status(), IsOk());
  std::vector<std::byte> in_region(1);
  for (const absl::Span<std::byte>& l : lent) in_region.insert(in_region.end(), l.begin(), l.end());
  in_region[0] = pulled[0].back()[0];
  EXPECT_TRUE(in_region == pulled[0].back()) << "copied out of the region, version 3 changed";
}

// A client of job `job` on `servers` that takes the same-host route.
ClientOptions SharedMemoryOptions(const std::vector<ServerProcess>& servers, std::string job) {
  ClientOptions options;
  options.servers = Addresses(servers);
  options.job = std::move(job);
  options.shared_memory = true;
  return options;
}

// A prefetch into the region written ahead by a speculation of a step then
// skipped holds the version when it returns (tests/server/skipped_prefetch.h).
TEST(SharedMemoryPullBuffersTest, APrefetchWrittenAheadOfASkippedStepHoldsTheVersion) {
  std::vector<ServerProcess> servers = StartServers(1);
  ASSERT_EQ(servers.size(), 1u);
  ZO_ASSERT_OK_AND_ASSIGN(auto client, OffloadClient::Open(SharedMemoryOptions(servers, "skipped"),
                                                           kSkippedConfig, kSkippedManifest));
  const std::vector<absl::Span<std::byte>> lent = client->RegionPullBuffers(std::vector<int>{0});
  ASSERT_EQ(lent.size(), 1u);
  PrefetchAcrossASkippedStep(*client, lent[0]);
}

// With a keeper, the buffers RegionPullBuffers and PushBuffers lend stay
// mapped, holding the last pull and what was pushed from them, after the
// client (which made the region) is gone: zo.torch's parameters and its
// engine's .grad live there. Each call's keeper alone keeps the region.
TEST(SharedMemoryKeeperTest, EitherCallsKeeperKeepsTheLentBuffersAfterTheClientCloses) {
  std::vector<ServerProcess> servers = StartServers(1);
  ASSERT_EQ(servers.size(), 1u);
  const std::vector<TensorSpec> manifest = {
      {.name = "a", .shape = {3000}, .dtype = DType::kBFloat16}};
  std::vector<float> init(3000);
  std::vector<uint16_t> w(init.size()), g(init.size());
  for (size_t i = 0; i < w.size(); ++i) {
    init[i] = static_cast<float>(i % 11) - 5;  // exact in bf16
    w[i] = FloatToBf16Bits(init[i]);
    g[i] = FloatToBf16Bits(static_cast<float>(i % 7) - 3);
  }
  for (const bool push_keeps : {false, true}) {
    SCOPED_TRACE(push_keeps ? "PushBuffers' keeper" : "RegionPullBuffers' keeper");
    ZO_ASSERT_OK_AND_ASSIGN(
        auto client, OffloadClient::Open(SharedMemoryOptions(servers, push_keeps ? "push" : "pull"),
                                         kLentConfig, manifest));
    std::shared_ptr<const void> keeper;
    const std::vector<absl::Span<std::byte>> pulled =
        client->RegionPullBuffers(std::vector<int>{0}, push_keeps ? nullptr : &keeper);
    ZO_ASSERT_OK_AND_ASSIGN(
        const std::vector<absl::Span<std::byte>> pushed,
        client->PushBuffers(1, std::vector<int>{0}, push_keeps ? &keeper : nullptr));
    ASSERT_EQ(pulled.size(), 1u);
    ASSERT_EQ(pushed.size(), 1u);
    ASSERT_NE(keeper, nullptr);
    ASSERT_THAT(client->InitParams(0, init), IsOk());
    ASSERT_THAT(client->Pull(0, -1, std::vector<int>{0}, pulled).status(), IsOk());
    ASSERT_EQ(pushed[0].size(), g.size() * 2);
    std::memcpy(pushed[0].data(), g.data(), pushed[0].size());
    ASSERT_THAT(client->PushShared(1, 0, std::make_shared<int>(0), pushed[0]), IsOk());
    ASSERT_THAT(client->FinishStep(1), IsOk());
    EXPECT_EQ(client->traffic().pushed_in_place_bytes, static_cast<int64_t>(pushed[0].size()));
    client.reset();
    ASSERT_EQ(pulled[0].size(), w.size() * 2);
    EXPECT_EQ(std::memcmp(pulled[0].data(), w.data(), pulled[0].size()), 0);
    EXPECT_EQ(std::memcmp(pushed[0].data(), g.data(), pushed[0].size()), 0);
    pulled[0][0] = std::byte{1};  // still writable memory of this process
    pushed[0][0] = std::byte{1};
  }
}

// Two servers stripe the chunks: a tensor lent must lie whole on one.
TEST(SharedMemoryPullBuffersTest, OnlyTensorsWholeOnOneServerAreLent) {
  std::vector<ServerProcess> servers = StartServers(2);
  ASSERT_EQ(servers.size(), 2u);
  ClientOptions options;
  options.servers = Addresses(servers);
  options.job = "striped";
  // "b" begins in chunk 0 (server 0) and ends in chunk 1 (server 1).
  ZO_ASSERT_OK_AND_ASSIGN(
      auto striped,
      OffloadClient::Open(options, kLentConfig,
                          {{.name = "a", .shape = {3000}, .dtype = DType::kBFloat16},
                           {.name = "b", .shape = {3000}, .dtype = DType::kBFloat16}}));
  EXPECT_FALSE(striped->RegionPullBuffers(std::vector<int>{0}).empty());
  EXPECT_TRUE(striped->RegionPullBuffers(std::vector<int>{0, 1}).empty());
  // A chunk each: a and c on server 0 (its local chunks 0 and 1), b on 1.
  options.job = "a-chunk-each";
  const std::vector<TensorSpec> manifest = {
      {.name = "a", .shape = {4096}, .dtype = DType::kBFloat16},
      {.name = "b", .shape = {4096}, .dtype = DType::kBFloat16},
      {.name = "c", .shape = {100}, .dtype = DType::kBFloat16}};
  ZO_ASSERT_OK_AND_ASSIGN(auto client, OffloadClient::Open(options, kLentConfig, manifest));
  const std::vector<int> tensors = {0, 1, 2};
  const std::vector<absl::Span<std::byte>> lent = client->RegionPullBuffers(tensors);
  ASSERT_EQ(lent.size(), 3u);
  for (int t = 0; t < 3; ++t) {
    std::vector<uint16_t> g(static_cast<size_t>(NumElements(manifest[t].shape)));
    for (size_t i = 0; i < g.size(); ++i) g[i] = FloatToBf16Bits(static_cast<float>(i % 7) - 3);
    ASSERT_THAT(client->Push(1, t, {reinterpret_cast<const std::byte*>(g.data()), g.size() * 2}),
                IsOk());
  }
  ASSERT_THAT(client->FinishStep(1), IsOk());
  ASSERT_THAT(client->Pull(1, -1, tensors, lent).status(), IsOk());
  options.shared_memory = false;
  ZO_ASSERT_OK_AND_ASSIGN(auto grpc, OffloadClient::Open(options, kLentConfig, manifest));
  std::vector<std::vector<std::byte>> reference;
  std::vector<absl::Span<std::byte>> dst;
  for (const TensorSpec& t : manifest) {
    reference.emplace_back(static_cast<size_t>(NumElements(t.shape)) * 2);
    dst.push_back(absl::MakeSpan(reference.back()));
  }
  ASSERT_THAT(grpc->Pull(1, -1, tensors, dst).status(), IsOk());
  for (int t = 0; t < 3; ++t) {
    EXPECT_TRUE(
        std::equal(lent[t].begin(), lent[t].end(), reference[t].begin(), reference[t].end()))
        << manifest[t].name;
  }
}

// Gradients written into the places PushBuffers lends and pushed
// from there are summed as the gRPC route sums them, step after step through
// both gradient areas; a push of a lent tensor from other bytes takes gRPC
// and leaves the lent bytes as they were.
TEST(SharedMemoryPushBuffersTest, PushesFromTheLentPlacesAreTheGrpcRoutes) {
  std::vector<ServerProcess> servers = StartServers(1);
  ASSERT_EQ(servers.size(), 1u);
  const std::vector<int>& tensors = kLentTensors;
  const std::vector<std::unique_ptr<OffloadClient>> clients =
      OpenBothRoutes(servers, "push-buffers-shm", "push-buffers-grpc");
  ASSERT_EQ(clients.size(), 2u);
  OffloadClient& shm = *clients[0];
  OffloadClient& grpc = *clients[1];
  EXPECT_THAT(grpc.PushBuffers(1, tensors), IsOkAndHolds(::testing::IsEmpty()))
      << "no region, no buffers";
  constexpr int64_t kSteps = 5;
  std::byte* area_of_step_1 = nullptr;
  int64_t lent_bytes_pushed = 0;
  for (int64_t step = 1; step <= kSteps; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    ZO_ASSERT_OK_AND_ASSIGN(const std::vector<absl::Span<std::byte>> lent,
                            shm.PushBuffers(step, tensors));
    ASSERT_EQ(lent.size(), 3u);
    EXPECT_EQ(lent[0].size(), 5000u * 2);
    EXPECT_TRUE(lent[1].empty());
    EXPECT_EQ(lent[2].size(), 9000u * 2);
    // Steps take the two gradient areas in turn.
    if (step == 1) area_of_step_1 = lent[0].data();
    EXPECT_EQ(lent[0].data() == area_of_step_1, step % 2 == 1);
    // The last step pushes "c" from its own bytes; the lent ones hold a
    // pattern the server must not take.
    const bool c_elsewhere = step == kSteps;
    for (int t = 0; t < 3; ++t) {
      const std::vector<uint16_t> g = LentGradient(step, t);
      ASSERT_THAT(grpc.Push(step, t, BytesOf(g)), IsOk());
      if (t == 2 && c_elsewhere) {
        std::memset(lent[2].data(), 0x7f, lent[2].size());
        ASSERT_THAT(shm.Push(step, t, BytesOf(g)), IsOk());
        continue;
      }
      std::ranges::copy(BytesOf(g), lent[t].begin());  // "b" is empty: no memcpy of null
      ASSERT_THAT(shm.PushShared(step, t, std::make_shared<int>(0), lent[t]), IsOk());
      lent_bytes_pushed += static_cast<int64_t>(lent[t].size());
    }
    ASSERT_THAT(shm.FinishStep(step), IsOk());
    ASSERT_THAT(grpc.FinishStep(step), IsOk());
    EXPECT_EQ(PulledWeights(shm, step), PulledWeights(grpc, step)) << "version " << step;
    if (c_elsewhere) {
      EXPECT_TRUE(std::all_of(lent[2].begin(), lent[2].end(), [](std::byte b) {
        return b == std::byte{0x7f};
      })) << "a push from other bytes wrote the lent ones";
    }
  }
  EXPECT_EQ(shm.traffic().pushed_in_place_bytes, lent_bytes_pushed)
      << "the pushes from the lent places were not sent from there";
  EXPECT_EQ(grpc.traffic().pushed_in_place_bytes, 0);
}

// One step of kLentManifest's gradients on both jobs, shm's from the places
// PushBuffers lends when it lends any (adding their bytes to *in_place),
// else from the gradients' own bytes; whether it lent them.
bool StepBothFromPlaces(OffloadClient& shm, OffloadClient& grpc, int64_t step, int64_t* in_place) {
  absl::StatusOr<std::vector<absl::Span<std::byte>>> lent = shm.PushBuffers(step, kLentTensors);
  EXPECT_THAT(lent.status(), IsOk());
  if (!lent.ok()) return false;
  for (int t = 0; t < 3; ++t) {
    const std::vector<uint16_t> g = LentGradient(step, t);
    EXPECT_THAT(grpc.Push(step, t, BytesOf(g)), IsOk());
    if (lent->empty() || (*lent)[t].empty()) {
      EXPECT_THAT(shm.Push(step, t, BytesOf(g)), IsOk());
      continue;
    }
    std::memcpy((*lent)[t].data(), g.data(), (*lent)[t].size());
    EXPECT_THAT(shm.PushShared(step, t, std::make_shared<int>(0), (*lent)[t]), IsOk());
    *in_place += static_cast<int64_t>((*lent)[t].size());
  }
  EXPECT_THAT(shm.FinishStep(step), IsOk());
  EXPECT_THAT(grpc.FinishStep(step), IsOk());
  return !lent->empty();
}

// The server reads every piece in the region until its step's update ends,
// so a gradient area is written again only after a pull has shown that
// update over. A worker that pushes a third step without pulling the first
// gets no places in the first's area, and its pushes take gRPC; the
// weights stay the gRPC route's, and the places come back after a pull.
TEST(SharedMemoryPushBuffersTest, AnAreaIsWrittenAgainOnlyAfterAPullOfItsStep) {
  std::vector<ServerProcess> servers = StartServers(1);
  ASSERT_EQ(servers.size(), 1u);
  const std::vector<std::unique_ptr<OffloadClient>> clients =
      OpenBothRoutes(servers, "area-reuse-shm", "area-reuse-grpc");
  ASSERT_EQ(clients.size(), 2u);
  OffloadClient& shm = *clients[0];
  OffloadClient& grpc = *clients[1];
  int64_t in_place = 0;
  for (int64_t step = 1; step <= 5; ++step) {
    // Step 3 reuses step 1's area, which no pull has shown read yet; step 4
    // reuses step 2's, pulled after step 3.
    EXPECT_EQ(StepBothFromPlaces(shm, grpc, step, &in_place), step != 3) << "step " << step;
    if (step >= 3) {
      EXPECT_EQ(PulledWeights(shm, step), PulledWeights(grpc, step)) << "version " << step;
    }
  }
  EXPECT_EQ(shm.traffic().pushed_in_place_bytes, in_place);
  EXPECT_EQ(in_place, 4 * (5000 + 9000) * 2) << "steps 1, 2, 4 and 5 from their places";
}

// A restore takes the job back: it ended the server's reads of both areas,
// and the steps retaken reuse an area only once a pull of their own has
// shown its update over, however far the steps before the restore got.
TEST(SharedMemoryPushBuffersTest, StepsRetakenAfterARestoreReuseAnAreaOnlyAfterTheirPull) {
  const std::string ckpt = FreshTempDir("shm_area_restore");
  std::vector<ServerProcess> servers = StartServers(1, {"--checkpoint-dir", ckpt});
  ASSERT_EQ(servers.size(), 1u);
  const std::vector<std::unique_ptr<OffloadClient>> clients =
      OpenBothRoutes(servers, "area-restore-shm", "area-restore-grpc");
  ASSERT_EQ(clients.size(), 2u);
  OffloadClient& shm = *clients[0];
  OffloadClient& grpc = *clients[1];
  int64_t in_place = 0;
  auto step_both = [&](int64_t step) { return StepBothFromPlaces(shm, grpc, step, &in_place); };
  std::vector<std::string> paths;
  for (int64_t step = 1; step <= 6; ++step) {
    EXPECT_TRUE(step_both(step)) << "step " << step;
    EXPECT_EQ(PulledWeights(shm, step), PulledWeights(grpc, step)) << "version " << step;
    if (step == 2) {
      ZO_ASSERT_OK_AND_ASSIGN(const std::string shm_path, shm.Checkpoint(2));
      ZO_ASSERT_OK_AND_ASSIGN(const std::string grpc_path, grpc.Checkpoint(2));
      paths = {shm_path, grpc_path};
    }
  }
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_THAT(shm.Restore(paths[0]), IsOkAndHolds(2));
  EXPECT_THAT(grpc.Restore(paths[1]), IsOkAndHolds(2));
  // Steps 3 and 4 again, with no pull: step 5 would write step 3's area,
  // whose update no pull has shown over (the pulls of version 6 before the
  // restore say nothing of it).
  EXPECT_TRUE(step_both(3));
  EXPECT_TRUE(step_both(4));
  EXPECT_FALSE(step_both(5)) << "step 5 took step 3's area before a pull of version 3";
  EXPECT_EQ(PulledWeights(shm, 5), PulledWeights(grpc, 5));
  EXPECT_TRUE(step_both(6));
  EXPECT_EQ(PulledWeights(shm, 6), PulledWeights(grpc, 6));
}

// Gradients pushed on the same-host route (every region piece says
// region_lent, by PushLent and PushShared alike) give the gRPC route's bits
// step after step, clipped and not. The server reads them in the region: a
// tensor's bytes changed there after its push (which a worker must not do),
// while its chunk still waits for the next tensor, are what the update
// takes. (Blocks: offload/gradient_source.h, 64 Ki elements.)
TEST(SharedMemoryLentPushTest, LentPiecesAreReadInTheRegionUntilTheUpdate) {
  std::vector<ServerProcess> servers = StartServers(1);
  ASSERT_EQ(servers.size(), 1u);
  const std::vector<TensorSpec>& manifest = kBlockManifest;
  std::vector<std::unique_ptr<OffloadClient>> clients;
  for (const bool shm : {true, false}) {
    ClientOptions options;
    options.job = shm ? "lent-shm" : "lent-grpc";
    options.servers = Addresses(servers);
    options.shared_memory = shm;
    ZO_ASSERT_OK_AND_ASSIGN(clients.emplace_back(),
                            OffloadClient::Open(options, R"({"train_batch_size": 1,
                                "bf16": {"enabled": true}, "gradient_clipping": 2.0,
                                "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
                                "zo": {"chunk_elems": 262144}})",
                                                manifest));
  }
  OffloadClient& shm = *clients[0];
  OffloadClient& grpc = *clients[1];
  ASSERT_THAT(shm.routes(), ElementsAre("shared_memory"));
  constexpr int64_t kSteps = 4;
  for (int64_t step = 1; step <= kSteps; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    const float scale = step % 2 == 1 ? 1.0f : 1e-4f;
    // The last two steps push a from its place in the region, then change
    // it: step 3 by PushShared, step 4 by PushLent.
    const bool changed_after = step >= kSteps - 1;
    absl::Span<std::byte> place;
    if (changed_after) {
      ZO_ASSERT_OK_AND_ASSIGN(const std::vector<absl::Span<std::byte>> lent,
                              shm.PushBuffers(step, std::vector<int>{0}));
      ASSERT_EQ(lent.size(), 1u);
      place = lent[0];
    }
    for (int t = 0; t < 3; ++t) {
      auto g = std::make_shared<std::vector<uint16_t>>(BlockGradient(step, t, scale));
      absl::Span<const std::byte> bytes = BytesOf(*g);
      if (t == 0 && changed_after) {
        std::memcpy(place.data(), g->data(), place.size());
        bytes = place;
      }
      if (step == kSteps - 1) {
        ASSERT_THAT(shm.PushShared(step, t, g, bytes), IsOk());
      } else {
        ASSERT_THAT(shm.PushLent(step, t, g, bytes), IsOk());
      }
      if (t == 0 && changed_after) {
        // a's first gradient block, which lies wholly in the piece, is read
        // in place (the rest of the piece is copied as it comes): its chunk
        // still waits for b, so the server has not read it yet and will
        // read these bytes.
        const std::vector<uint16_t> other = BlockGradient(step, t, -2 * scale);
        std::copy(other.begin(), other.begin() + (64 << 10), g->begin());
        std::memcpy(place.data(), g->data(), (64 << 10) * sizeof(uint16_t));
      }
      ASSERT_THAT(grpc.Push(step, t, BytesOf(*g)), IsOk());
    }
    ASSERT_THAT(shm.FinishStep(step), IsOk());
    ASSERT_THAT(grpc.FinishStep(step), IsOk());
    EXPECT_EQ(PulledTensors(shm, step, manifest), PulledTensors(grpc, step, manifest));
  }
}

// What is not lent: tensors striped over servers, jobs whose micro-batches
// the servers sum, bad arguments, and a step whose area another step's
// places, not yet finished, still use.
TEST(SharedMemoryPushBuffersTest, RefusesWhatItCannotLend) {
  std::vector<ServerProcess> servers = StartServers(2);
  ASSERT_EQ(servers.size(), 2u);
  ClientOptions options;
  options.servers = Addresses(servers);
  options.job = "push-striped";
  // "b" begins in chunk 0 (server 0) and ends in chunk 1 (server 1).
  const std::vector<TensorSpec> striped = {
      {.name = "a", .shape = {3000}, .dtype = DType::kBFloat16},
      {.name = "b", .shape = {3000}, .dtype = DType::kBFloat16}};
  ZO_ASSERT_OK_AND_ASSIGN(auto client, OffloadClient::Open(options, kLentConfig, striped));
  EXPECT_THAT(client->PushBuffers(1, std::vector<int>{0, 1}), IsOkAndHolds(::testing::IsEmpty()));
  EXPECT_THAT(client->PushBuffers(0, std::vector<int>{0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("numbered from 1")));
  EXPECT_THAT(client->PushBuffers(1, std::vector<int>{2}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tensor")));
  ZO_ASSERT_OK_AND_ASSIGN(const auto step_1, client->PushBuffers(1, std::vector<int>{0}));
  ASSERT_EQ(step_1.size(), 1u);
  ZO_ASSERT_OK_AND_ASSIGN(const auto step_2, client->PushBuffers(2, std::vector<int>{0}));
  EXPECT_NE(step_1[0].data(), step_2[0].data());
  EXPECT_THAT(client->PushBuffers(3, std::vector<int>{0}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("step 1")));
  ASSERT_THAT(client->FinishStep(1), IsOk());
  EXPECT_THAT(client->PushBuffers(3, std::vector<int>{0}), IsOkAndHolds(::testing::SizeIs(1)));

  options.job = "push-micro-batches";
  ZO_ASSERT_OK_AND_ASSIGN(
      auto micro,
      OffloadClient::Open(options,
                          R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
          "zo": {"chunk_elems": 4096, "gradient_accumulation": "servers"}})",
                          {{.name = "w", .shape = {100}, .dtype = DType::kFloat32}}));
  EXPECT_EQ(micro->routes()[0], "shared_memory");
  EXPECT_THAT(micro->PushBuffers(1, std::vector<int>{0}), IsOkAndHolds(::testing::IsEmpty()));
}

std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

// A memfd of `bytes` beginning with the proof "0123456789abcdef", sealed
// against resizing unless `seal` is false.
int Memfd(int64_t bytes, bool seal) {
  const int fd = memfd_create("test-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, bytes), 0);
  EXPECT_EQ(pwrite(fd, "0123456789abcdef", 16, 0), 16);
  if (seal) {
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  }
  return fd;
}

// Attaches the 4 KiB memfd `fd` (Memfd) to `job` as a worker would.
absl::StatusOr<v1::AttachRegionResponse> AttachByHand(v1::Offload::Stub& stub, int fd,
                                                      const std::string& job) {
  v1::AttachRegionRequest request;
  request.set_proof("0123456789abcdef");
  request.set_job(job);
  request.set_pid(getpid());
  request.set_fd(fd);
  request.set_bytes(4096);
  request.set_boot_id(BootId());
  v1::AttachRegionResponse response;
  grpc::ClientContext context;
  ZO_RETURN_IF_ERROR(FromGrpcStatus(stub.AttachRegion(&context, request, &response)));
  return response;
}

// Calls made by hand, as a hostile or broken worker would: each is refused
// with a code that says why, and the job is as it was.
TEST(SharedMemoryRegionTest, BadRegionsAndRangesAreRefusedAndChangeNothing) {
  std::vector<ServerProcess> servers = StartServers(1);
  ASSERT_EQ(servers.size(), 1u);
  ClientOptions options;
  options.job = "hostile";
  options.servers = Addresses(servers);
  options.shared_memory = false;  // this client only opens the job and reads its status
  ZO_ASSERT_OK_AND_ASSIGN(
      auto client, OffloadClient::Open(options, R"({"train_batch_size": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})",
                                       {{.name = "w", .shape = {64}, .dtype = DType::kFloat32}}));
  auto stub = v1::Offload::NewStub(
      grpc::CreateChannel(servers[0].address(), grpc::InsecureChannelCredentials()));
  const std::string proof = "0123456789abcdef";
  auto attach = [&](int fd, int64_t bytes, const std::string& boot_id,
                    const std::string& job = "hostile", const std::string& with = "") {
    v1::AttachRegionRequest request;
    request.set_proof(with.empty() ? proof : with);
    request.set_job(job);
    request.set_pid(getpid());
    request.set_fd(fd);
    request.set_bytes(bytes);
    request.set_boot_id(boot_id);
    v1::AttachRegionResponse response;
    grpc::ClientContext context;
    absl::Status s = FromGrpcStatus(stub->AttachRegion(&context, request, &response));
    return s.ok() ? absl::StatusOr<uint64_t>(response.region()) : absl::StatusOr<uint64_t>(s);
  };
  const int unsealed = Memfd(4096, false);
  EXPECT_THAT(attach(unsealed, 4096, BootId()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not sealed")));
  const int fd = Memfd(4096, true);
  EXPECT_THAT(attach(fd, 4096, "another-host").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("another host")));
  EXPECT_THAT(attach(fd, 8192, BootId()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is not 8192 bytes")));
  EXPECT_THAT(attach(100000, 4096, BootId()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cannot open")));
  EXPECT_THAT(attach(fd, 4096, BootId(), "no-such-job").status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  // Another process's region, which the server could open: the caller does
  // not know what it begins with.
  EXPECT_THAT(attach(fd, 4096, BootId(), "hostile", "fedcba9876543210").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("proof")));
  ZO_ASSERT_OK_AND_ASSIGN(const uint64_t region, attach(fd, 4096, BootId()));
  ZO_ASSERT_OK_AND_ASSIGN(v1::JobStatus before, client->JobStatus());

  // A push naming bytes outside the region, a region that is not there, or
  // a region and data at once.
  auto push = [&](uint64_t id, int64_t offset, int64_t bytes, bool with_data,
                  int64_t ack_offset = 0, int64_t step = 1) {
    v1::GradientPiece piece;
    piece.set_job("hostile");
    piece.set_step(step);
    piece.set_region_ack_offset(ack_offset);
    piece.set_region_ack(7);
    piece.set_dtype(v1::DTYPE_FP32);
    piece.set_incarnation(before.incarnation());
    piece.set_region(id);
    piece.set_region_offset(offset);
    piece.set_region_bytes(bytes);
    if (with_data) piece.set_data(std::string(256, '\0'));
    v1::PushGradientsResponse response;
    grpc::ClientContext context;
    auto writer = stub->PushGradients(&context, &response);
    writer->Write(piece);
    writer->WritesDone();
    return FromGrpcStatus(writer->Finish());
  };
  EXPECT_THAT(push(region, 4096 - 128, 256, false),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not inside")));
  EXPECT_THAT(push(region, -8, 256, false),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not inside")));
  EXPECT_THAT(push(region, int64_t{1} << 62, int64_t{1} << 62, false),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not inside")));
  EXPECT_THAT(push(region + 1, 0, 256, false),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not attached")));
  EXPECT_THAT(push(region, 0, 256, true),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("carries data")));
  // An acknowledgement slot that is not aligned, lies past the end, or
  // belongs to no region.
  EXPECT_THAT(push(region, 256, 256, false, 68),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("acknowledgement slot")));
  EXPECT_THAT(push(region, 256, 256, false, 4096 - 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("acknowledgement slot")));
  EXPECT_THAT(push(region, 256, 256, false, -8),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("acknowledgement slot")));
  EXPECT_THAT(push(0, 0, 0, true, 64),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no shared region")));

  // A pull into a weights area past the region's end.
  {
    v1::PullParamsRequest request;
    request.set_job("hostile");
    request.set_version(0);
    request.set_have_version(-1);
    request.set_region(region);
    request.set_region_offset(4096 - 64);  // 64 fp32 elements need 256 bytes
    grpc::ClientContext context;
    auto reader = stub->PullParams(&context, request);
    v1::ParamPiece piece;
    while (reader->Read(&piece)) {
    }
    EXPECT_THAT(FromGrpcStatus(reader->Finish()),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cannot hold")));
  }
  ZO_ASSERT_OK_AND_ASSIGN(v1::JobStatus after, client->JobStatus());
  EXPECT_EQ(after.version(), before.version());
  EXPECT_EQ(after.waiting_pushes(), 0);
  EXPECT_EQ(after.incarnation(), before.incarnation());
  // The job still trains, bit for bit as it would have.
  std::vector<float> g(64, 0.5f);
  ASSERT_THAT(client->Push(1, 0, {reinterpret_cast<const std::byte*>(g.data()), 256}), IsOk());
  ASSERT_THAT(client->FinishStep(1), IsOk());
  // A piece summed from the region is acknowledged in its slot, and nothing
  // else of the region's first page is touched.
  std::vector<char> page_before(4096);
  ASSERT_EQ(pread(fd, page_before.data(), page_before.size(), 0), 4096);
  EXPECT_THAT(push(region, 256, 256, false, 64, 2), IsOk());
  std::vector<char> page_after(4096);
  ASSERT_EQ(pread(fd, page_after.data(), page_after.size(), 0), 4096);
  uint32_t ack = 0;
  std::memcpy(&ack, page_after.data() + 64, sizeof(ack));
  EXPECT_EQ(ack, 7u);
  std::memcpy(page_after.data() + 64, page_before.data() + 64, sizeof(ack));
  EXPECT_EQ(page_after, page_before);
  close(fd);
  close(unsealed);
}

// The same-host route's batched messages (GradientPiece.more_ranges), sent
// by hand: each range is a piece of its own, summed and acknowledged in
// order; a message with one bad range is refused whole before any of its
// pieces is summed.
TEST(SharedMemoryRegionTest, OneMessageCarriesManyPiecesEachSummedAndAcknowledgedInOrder) {
  std::vector<ServerProcess> servers = StartServers(1);
  ASSERT_EQ(servers.size(), 1u);
  constexpr int kElems = 256;
  auto open = [&](const std::string& job) {
    ClientOptions options;
    options.job = job;
    options.servers = Addresses(servers);
    options.shared_memory = false;
    return OffloadClient::Open(options, R"({"train_batch_size": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})",
                               {{.name = "w", .shape = {kElems}, .dtype = DType::kFloat32}});
  };
  ZO_ASSERT_OK_AND_ASSIGN(auto batched, open("batched"));
  ZO_ASSERT_OK_AND_ASSIGN(auto reference, open("reference"));
  std::vector<float> init(kElems);
  std::vector<float> g(kElems);
  for (int i = 0; i < kElems; ++i) {
    init[i] = 0.01f * static_cast<float>(i % 17) - 0.08f;
    g[i] = 0.001f * static_cast<float>((i * 7) % 23) - 0.01f;
  }
  ASSERT_THAT(batched->InitParams(0, init), IsOk());
  ASSERT_THAT(reference->InitParams(0, init), IsOk());
  ASSERT_THAT(reference->Push(1, 0, {reinterpret_cast<const std::byte*>(g.data()), 4 * kElems}),
              IsOk());
  ASSERT_THAT(reference->FinishStep(1), IsOk());

  auto stub = v1::Offload::NewStub(
      grpc::CreateChannel(servers[0].address(), grpc::InsecureChannelCredentials()));
  const int fd = Memfd(4096, true);
  constexpr int64_t kAt = 1024;  // where the gradient lies in the region
  ASSERT_EQ(pwrite(fd, g.data(), 4 * kElems, kAt), 4 * kElems);
  ZO_ASSERT_OK_AND_ASSIGN(const v1::AttachRegionResponse attached,
                          AttachByHand(*stub, fd, "batched"));
  EXPECT_TRUE(attached.batched_ranges());
  ZO_ASSERT_OK_AND_ASSIGN(v1::JobStatus status, batched->JobStatus());

  // Four pieces of 64 elements in one message, acknowledged 1, 2, 3, 4 in
  // the slot at 64 (the last write wins: the slot holds the newest).
  auto message = [&](uint64_t region, int64_t bad_range_offset) {
    v1::GradientPiece piece;
    piece.set_job("batched");
    piece.set_step(1);
    piece.set_dtype(v1::DTYPE_FP32);
    piece.set_incarnation(status.incarnation());
    piece.set_region(region);
    piece.set_region_offset(kAt);
    piece.set_region_bytes(256);
    piece.set_region_ack_offset(64);
    piece.set_region_ack(1);
    for (int k = 1; k < 4; ++k) {
      v1::RegionRange* r = piece.add_more_ranges();
      r->set_offset(64 * k);
      r->set_region_offset(k == 2 && bad_range_offset != 0 ? bad_range_offset : kAt + 256 * k);
      r->set_region_bytes(256);
      r->set_region_ack_offset(64);
      r->set_region_ack(static_cast<uint32_t>(k + 1));
    }
    return piece;
  };
  auto send = [&](const v1::GradientPiece& piece, v1::PushGradientsResponse* response) {
    grpc::ClientContext context;
    auto writer = stub->PushGradients(&context, response);
    writer->Write(piece);
    writer->WritesDone();
    return FromGrpcStatus(writer->Finish());
  };
  v1::PushGradientsResponse response;
  EXPECT_THAT(send(message(attached.region(), 4096 - 128), &response),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not inside")));
  v1::GradientPiece no_region = message(0, 0);
  no_region.set_region_ack_offset(0);
  no_region.set_data(std::string(256, '\0'));
  EXPECT_THAT(send(no_region, &response),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("more_ranges")));
  uint32_t ack = 0;
  ASSERT_EQ(pread(fd, &ack, sizeof(ack), 64), 4);
  EXPECT_EQ(ack, 0u) << "a refused message acknowledged a piece";

  // Nothing of the refused ones was summed: the whole message is taken now.
  ASSERT_THAT(send(message(attached.region(), 0), &response), IsOk());
  EXPECT_EQ(response.pieces(), 4);
  EXPECT_EQ(response.bytes(), 4 * kElems);
  ASSERT_EQ(pread(fd, &ack, sizeof(ack), 64), 4);
  EXPECT_EQ(ack, 4u);
  std::vector<float> got(kElems);
  std::vector<float> want(kElems);
  ZO_ASSERT_OK_AND_ASSIGN(
      bool changed,
      batched->Pull(1, 0, std::vector<int>{0},
                    {absl::MakeSpan(reinterpret_cast<std::byte*>(got.data()), 4 * kElems)}));
  EXPECT_TRUE(changed);
  ZO_ASSERT_OK_AND_ASSIGN(
      changed,
      reference->Pull(1, 0, std::vector<int>{0},
                      {absl::MakeSpan(reinterpret_cast<std::byte*>(want.data()), 4 * kElems)}));
  EXPECT_EQ(std::memcmp(got.data(), want.data(), 4 * kElems), 0)
      << "the batched pieces did not train as one push of the gradient";
  EXPECT_NE(got, init);
  close(fd);
}

// A pull into a region with batched_ranges, asked by hand: the server
// describes its pieces in fewer messages than pieces, and the region then
// holds the bytes a gRPC pull gives; without batched_ranges, one piece a
// message, as an older client expects.
TEST(SharedMemoryRegionTest, APullDescribesManyPiecesInOneMessageWhenAsked) {
  std::vector<ServerProcess> servers = StartServers(1);
  ASSERT_EQ(servers.size(), 1u);
  constexpr int kTensors = 8;
  constexpr int kElems = 64;
  std::vector<TensorSpec> manifest;
  for (int t = 0; t < kTensors; ++t) {
    manifest.push_back({.name = absl::StrCat("w", t), .shape = {kElems}, .dtype = DType::kFloat32});
  }
  ClientOptions options;
  options.job = "batched-pull";
  options.servers = Addresses(servers);
  options.shared_memory = false;
  ZO_ASSERT_OK_AND_ASSIGN(auto client, OffloadClient::Open(options, R"({"train_batch_size": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})",
                                                           manifest));
  std::vector<float> values(kElems);
  for (int t = 0; t < kTensors; ++t) {
    for (int i = 0; i < kElems; ++i) values[i] = 0.01f * static_cast<float>(t * kElems + i);
    ASSERT_THAT(client->InitParams(t, values), IsOk());
  }
  std::vector<float> want(kTensors * kElems);
  std::vector<absl::Span<std::byte>> dst;
  std::vector<int> all;
  for (int t = 0; t < kTensors; ++t) {
    dst.push_back({reinterpret_cast<std::byte*>(want.data() + t * kElems), 4 * kElems});
    all.push_back(t);
  }
  ASSERT_THAT(client->Pull(0, -1, all, dst).status(), IsOk());

  auto stub = v1::Offload::NewStub(
      grpc::CreateChannel(servers[0].address(), grpc::InsecureChannelCredentials()));
  const int fd = Memfd(4096, true);
  ZO_ASSERT_OK_AND_ASSIGN(const v1::AttachRegionResponse attached,
                          AttachByHand(*stub, fd, "batched-pull"));
  constexpr int64_t kArea = 1024;
  auto pull = [&](bool batched, int* messages, int* pieces) {
    std::vector<char> zeros(4096 - kArea, 0);
    EXPECT_EQ(pwrite(fd, zeros.data(), zeros.size(), kArea), static_cast<ssize_t>(zeros.size()));
    v1::PullParamsRequest request;
    request.set_job("batched-pull");
    request.set_version(0);
    request.set_have_version(-1);
    request.set_region(attached.region());
    request.set_region_offset(kArea);
    request.set_batched_ranges(batched);
    grpc::ClientContext context;
    auto reader = stub->PullParams(&context, request);
    v1::ParamPiece piece;
    *messages = 0;
    *pieces = 0;
    while (reader->Read(&piece)) {
      ++*messages;
      *pieces += 1 + piece.more_ranges_size();
    }
    return FromGrpcStatus(reader->Finish());
  };
  int messages = 0;
  int pieces = 0;
  ASSERT_THAT(pull(false, &messages, &pieces), IsOk());
  EXPECT_EQ(messages, pieces);
  EXPECT_GE(pieces, kTensors);
  const int unbatched_pieces = pieces;
  ASSERT_THAT(pull(true, &messages, &pieces), IsOk());
  EXPECT_EQ(pieces, unbatched_pieces);
  EXPECT_LT(messages, pieces) << "every piece came in a message of its own";
  std::vector<float> got(kTensors * kElems);
  ASSERT_EQ(pread(fd, got.data(), 4 * got.size(), kArea), static_cast<ssize_t>(4 * got.size()));
  EXPECT_EQ(std::memcmp(got.data(), want.data(), 4 * got.size()), 0)
      << "the region does not hold what a gRPC pull gives";
  close(fd);
}

}  // namespace
}  // namespace zo::testing
