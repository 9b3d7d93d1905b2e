// Several TCP connections from a worker to each server it reaches over
// gRPC (zo.connections_per_server): each chunk's pieces take one of them,
// pulls come back a stripe of chunks on each, and what trains is bit for
// bit what one connection trains. Real zo-server processes on loopback;
// the connections are counted in the kernel's socket table.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/least_squares.h"
#include "tests/server/server_process.h"
#include "tests/server/training_harness.h"
#include "worker/client/offload_client.h"

namespace zo::testing {
namespace {

using ::testing::ElementsAre;

constexpr int kSteps = 12;

// This process's TCP connections in ESTABLISHED state to port `port`: the
// kernel's socket table, each row's inode among this process's open fds
// (the servers' own connections to each other are theirs, not counted).
int ConnectionsTo(int port) {
  std::set<uint64_t> ours;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::string target = std::filesystem::read_symlink(fd.path(), error).string();
    uint64_t inode = 0;
    if (!error && target.rfind("socket:[", 0) == 0 &&
        absl::SimpleAtoi(target.substr(8, target.size() - 9), &inode)) {
      ours.insert(inode);
    }
  }
  int count = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout;
      uint64_t inode = 0;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      const size_t colon = remote.rfind(':');
      uint32_t remote_port = 0;
      if (colon == std::string::npos ||
          !absl::SimpleHexAtoi(remote.substr(colon + 1), &remote_port)) {
        continue;
      }
      if (static_cast<int>(remote_port) == port && state == "01" && ours.contains(inode)) ++count;
    }
  }
  return count;
}

int PortOf(const std::string& address) {
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) << address;
  return port;
}

// The reference problem's job (5 chunks of 128 elements: 3 on server 0,
// 2 on server 1) over `connections` connections per server.
std::string Config(int connections) {
  return ReferenceJobConfig(absl::StrCat(
      R"("steps_per_print": 100, "zo": {"chunk_elems": 128, "connections_per_server": )",
      connections, "}"));
}

// That job trained with 2 dp ranks for kSteps steps; its weights.
std::vector<float> Train(const std::vector<ServerProcess>& servers, int connections,
                         std::vector<int>* counted = nullptr) {
  const LeastSquares p = ReferenceProblem();
  const std::string config = Config(connections);
  ClientOptions grpc_only;
  grpc_only.shared_memory = false;
  auto workers = OpenWorkers(p, DType::kFloat32, absl::StrCat("conn", connections), config,
                             Addresses(servers), grpc_only);
  EXPECT_THAT(workers.status(), IsOk());
  if (!workers.ok()) return {};
  EXPECT_THAT((*workers)[0]->client().routes(), ElementsAre("grpc", "grpc"));
  EXPECT_THAT((*workers)[0]->InitWeights(), IsOk());
  EXPECT_THAT(RunSteps(*workers, 1, kSteps), IsOk());
  auto x = (*workers)[0]->PullAll(kSteps);
  EXPECT_THAT(x.status(), IsOk());
  if (counted != nullptr) {
    for (const ServerProcess& s : servers) counted->push_back(ConnectionsTo(PortOf(s.address())));
  }
  return x.ok() ? *x : std::vector<float>{};
}

// One, two and three connections per server train the same bits; with
// three, each rank reaches server 0 (3 chunks) on three connections and
// server 1 (2 chunks) on two, the third never used: pushes and pulls go
// by chunk. Fresh servers per count, so that no other client's sockets
// are counted.
TEST(ConnectionsTest, SeveralConnectionsPerServerTrainTheBitsOfOne) {
  std::vector<float> one;
  {
    std::vector<ServerProcess> servers = StartServers(2);
    std::vector<int> counted;
    one = Train(servers, 1, &counted);
    EXPECT_THAT(counted, ElementsAre(2, 2));  // a connection per rank
  }
  ASSERT_FALSE(one.empty());
  for (const int connections : {2, 3}) {
    std::vector<ServerProcess> servers = StartServers(2);
    std::vector<int> counted;
    const std::vector<float> x = Train(servers, connections, &counted);
    ASSERT_EQ(x.size(), one.size()) << connections;
    EXPECT_EQ(std::memcmp(x.data(), one.data(), one.size() * sizeof(float)), 0) << connections;
    // Server 1's two chunks never use a third connection.
    EXPECT_THAT(counted, connections == 3 ? ElementsAre(6, 4) : ElementsAre(4, 4));
  }
}

// A follower killed while its pushes are out on three connections fails
// the step on every rank at once (no call waits out its deadline), and
// once it is back the job rolls back to its checkpoint and goes on to the
// weights of the run that never failed.
TEST(ConnectionsTest, AServerKilledMidStepFailsItAndTheRunResumesExactly) {
  std::vector<float> uninterrupted;
  {
    std::vector<ServerProcess> servers = StartServers(2);
    uninterrupted = Train(servers, 1);
  }
  ASSERT_FALSE(uninterrupted.empty());
  const LeastSquares p = ReferenceProblem();
  const std::string ckpt = FreshTempDir("connections_kill");
  std::vector<ServerProcess> servers = StartServers(2, {"--checkpoint-dir", ckpt});
  const std::vector<std::string> addresses = Addresses(servers);
  ClientOptions options;
  options.shared_memory = false;
  options.call_timeout = absl::Seconds(10);
  options.retry_for = absl::Seconds(2);
  {
    ZO_ASSERT_OK_AND_ASSIGN(auto workers,
                            OpenWorkers(p, DType::kFloat32, "kill", Config(3), addresses, options));
    ASSERT_THAT(workers[0]->InitWeights(), IsOk());
    ASSERT_THAT(RunSteps(workers, 1, 6), IsOk());
    ASSERT_THAT(workers[0]->client().Checkpoint(6).status(), IsOk());
    ASSERT_THAT(RunSteps(workers, 7, 8), IsOk());
    workers[0]->set_after_push([&](int64_t step) {
      if (step == 9) servers[1].Kill();
    });
    const absl::Status run = RunSteps(workers, 9, kSteps);
    workers[0]->set_after_push(nullptr);
    EXPECT_FALSE(run.ok());
    EXPECT_THAT(std::string(run.message()), ::testing::ContainsRegex("rank 0 step (9|10): "));
  }
  ZO_ASSERT_OK_AND_ASSIGN(servers[1],
                          ServerProcess::Start({"--checkpoint-dir", ckpt}, servers[1].port()));
  options.retry_for = absl::Minutes(1);
  ZO_ASSERT_OK_AND_ASSIGN(auto workers,
                          OpenWorkers(p, DType::kFloat32, "kill", Config(3), addresses, options));
  EXPECT_EQ(workers[0]->client().version(), 6);
  ASSERT_THAT(RunSteps(workers, 7, kSteps), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<float> x, workers[0]->PullAll(kSteps));
  ASSERT_EQ(x.size(), uninterrupted.size());
  EXPECT_EQ(std::memcmp(x.data(), uninterrupted.data(), x.size() * sizeof(float)), 0);
}

// zo.gradient_accumulation "servers": each micro-batch's pieces are summed
// on the server in the order they arrive, which is the order pushed only
// while every micro-batch of a chunk takes the same connection (the rule
// the test above checks by the connections each server sees; loopback
// rarely reorders pieces sent on two). Here the sums over four
// connections are one connection's, bit for bit.
TEST(ConnectionsTest, MicroBatchesSummedOnTheServersKeepTheirOrder) {
  std::vector<ServerProcess> servers = StartServers(1);
  constexpr int64_t kElems = 1 << 19;
  constexpr int kMicroBatches = 4;
  const std::vector<TensorSpec> manifest = {
      {.name = "w", .shape = {kElems}, .dtype = DType::kFloat32}};
  std::vector<std::vector<float>> weights;
  for (const int connections : {1, 4}) {
    const std::string config = absl::StrCat(
        R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": )", kMicroBatches,
        R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
            "zo": {"chunk_elems": 65536, "gradient_accumulation": "servers",
                   "connections_per_server": )",
        connections, "}}");
    ClientOptions options;
    options.job = absl::StrCat("micro-batches-", connections);
    options.servers = Addresses(servers);
    options.shared_memory = false;
    ZO_ASSERT_OK_AND_ASSIGN(std::unique_ptr<OffloadClient> client,
                            OffloadClient::Open(options, config, manifest));
    for (int64_t step = 1; step <= 3; ++step) {
      for (int mb = 0; mb < kMicroBatches; ++mb) {
        // Each micro-batch's values differ, and their sum rounds
        // differently in another order.
        auto g = std::make_shared<std::vector<float>>(kElems);
        for (int64_t i = 0; i < kElems; ++i) {
          (*g)[static_cast<size_t>(i)] = static_cast<float>((i * 7 + mb * 13 + step) % 101 - 50) *
                                         1e-3f * (mb % 2 == 0 ? 1e4f : 1e-4f);
        }
        const absl::Span<const std::byte> bytes(reinterpret_cast<const std::byte*>(g->data()),
                                                g->size() * sizeof(float));
        ASSERT_THAT(client->PushShared(step, 0, g, bytes, mb), IsOk());
      }
      ASSERT_THAT(client->FinishStep(step), IsOk());
    }
    std::vector<float> out(kElems);
    const std::vector<absl::Span<std::byte>> dst = {
        absl::MakeSpan(reinterpret_cast<std::byte*>(out.data()), kElems * sizeof(float))};
    ASSERT_THAT(client->Pull(3, -1, {0}, dst).status(), IsOk());
    weights.push_back(std::move(out));
  }
  EXPECT_EQ(std::memcmp(weights[0].data(), weights[1].data(), kElems * sizeof(float)), 0);
}

}  // namespace
}  // namespace zo::testing
