// The embedded default: an OffloadServer in the worker's own process, no
// socket, the same client API over an in-process channel.
#include <vector>

#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "server/offload_server.h"
#include "tests/server/least_squares.h"
#include "tests/server/training_harness.h"

namespace zo::testing {
namespace {

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

}  // namespace
}  // namespace zo::testing
