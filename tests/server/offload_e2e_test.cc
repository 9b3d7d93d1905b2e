// The offload tier end to end: real zo-server processes on loopback ports,
// dp workers as client-library threads, a least-squares problem whose exact
// gradients make the expected trajectory computable in double precision.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "offload/checkpoint/checkpoint_dir.h"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "rpc/error_detail.h"
#include "tests/server/least_squares.h"
#include "tests/server/server_process.h"
#include "tests/server/training_harness.h"

namespace zo::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kSteps = 50;

// AdamW with linear warmup and clipping; 5 chunks of 128 elements over the
// servers. clipping 0.5 is active for the first steps (initial norm ~2).
std::string ConfigJson(const std::string& precision = "", const std::string& dpu = "") {
  return ReferenceJobConfig(absl::StrCat(R"("steps_per_print": 10, )", precision,
                                         R"( "zo": {"chunk_elems": 128 )", dpu, "}"));
}

LeastSquares Problem() { return ReferenceProblem(); }

// Max over elements of |got - want| / (1 + |want|).
double MaxRelError(const std::vector<float>& got, const std::vector<double>& want) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]) / (1 + std::abs(want[i])));
  }
  return worst;
}

// A server's JobStatus of `job`.
v1::JobStatus StatusOf(const ServerProcess& server, const std::string& job) {
  auto stub = v1::Offload::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::GetJobStatusRequest request;
  request.set_job(job);
  v1::JobStatus status;
  const grpc::Status got = stub->GetJobStatus(&context, request, &status);
  EXPECT_TRUE(got.ok()) << got.error_message();
  return status;
}

// 2 servers x 2 dp ranks, steps 1..50, fp32: the servers' weights after
// each run, shared by the tests that compare against an uninterrupted run.
// Over gRPC, whose pieces come one a message: a chunk is speculated on when
// it fills before the step's last piece is in, which the same-host route,
// sending a push's pieces in one message, leaves to chance.
const std::vector<float>& UninterruptedWeights() {
  static const std::vector<float>* weights = [] {
    const LeastSquares p = Problem();
    std::vector<ServerProcess> servers = StartServers(2);
    ClientOptions grpc_only;
    grpc_only.shared_memory = false;
    auto workers =
        OpenWorkers(p, DType::kFloat32, "plain", ConfigJson(), Addresses(servers), grpc_only);
    EXPECT_THAT(workers.status(), IsOk());
    EXPECT_THAT((*workers)[0]->InitWeights(), IsOk());
    EXPECT_THAT(RunSteps(*workers, 1, kSteps), IsOk());
    auto x = (*workers)[0]->PullAll(kSteps);
    EXPECT_THAT(x.status(), IsOk());
    // Each server speculated on some chunks; the decisions kept or redid
    // every one of them.
    for (const ServerProcess& server : servers) {
      const v1::JobStatus st = StatusOf(server, "plain");
      EXPECT_EQ(st.no_speculation(), "") << st.server_index();
      EXPECT_GT(st.speculated_chunks(), 0) << st.server_index();
      EXPECT_EQ(st.confirmed_chunks() + st.redone_chunks(), st.speculated_chunks());
    }
    return new std::vector<float>(*x);
  }();
  return *weights;
}

TEST(OffloadE2eTest, TwoServersTwoRanksMatchTheDoublePrecisionReference) {
  const LeastSquares p = Problem();
  const std::vector<float>& x = UninterruptedWeights();
  ASSERT_EQ(x.size(), static_cast<size_t>(p.n));

  Reference ref(p, {.clipping = 0.5});
  for (int s = 1; s <= kSteps; ++s) ref.Step(s, false, 1.0);
  // fp32 arithmetic on the servers vs double here: each step moves a weight
  // by at most lr (Adam's normalised step), rounding adds ~2^-24 relative per
  // op; 50 steps stay far below 1e-5. A wrong formula (no bias correction,
  // no clipping, lr off by one step) misses by > 1e-3.
  EXPECT_LT(MaxRelError(x, ref.master()), 1e-5);
  EXPECT_LT(p.Loss(x), 0.5 * p.Loss(p.x0)) << "training should reduce the loss";
}

// The same run without the speculative update: every server speculated in
// the run above (lead and follower alike, clipping active in the first
// steps), and the weights are the same bits.
TEST(OffloadE2eTest, TheSpeculativeUpdateLeavesTheWeightsOfTheSynchronousOne) {
  const LeastSquares p = Problem();
  const std::vector<float>& speculative = UninterruptedWeights();
  std::vector<ServerProcess> servers = StartServers(2);
  const std::string config = ReferenceJobConfig(
      R"("steps_per_print": 10, "zo": {"chunk_elems": 128, "speculative_update": false})");
  auto workers = OpenWorkers(p, DType::kFloat32, "synchronous", config, Addresses(servers));
  ASSERT_THAT(workers.status(), IsOk());
  ASSERT_THAT((*workers)[0]->InitWeights(), IsOk());
  ASSERT_THAT(RunSteps(*workers, 1, kSteps), IsOk());
  auto synchronous = (*workers)[0]->PullAll(kSteps);
  ASSERT_THAT(synchronous.status(), IsOk());
  ASSERT_EQ(synchronous->size(), speculative.size());
  EXPECT_EQ(std::memcmp(synchronous->data(), speculative.data(), speculative.size() * 4), 0);
  for (const ServerProcess& server : servers) {
    const v1::JobStatus st = StatusOf(server, "synchronous");
    EXPECT_EQ(st.no_speculation(), "zo.speculative_update is false");
    EXPECT_EQ(st.speculated_chunks(), 0);
  }
}

// With the learning rates from the client (zo.client_lr, as zo.torch sends
// them), the follower hears them too and speculates as well; the weights
// are those of the run without speculation. Over gRPC, as
// UninterruptedWeights says why: on the same-host route the follower's two
// small chunks would fill at once and leave nothing to speculate.
TEST(OffloadE2eTest, ClientRatesReachTheFollowerWhichSpeculatesWithThem) {
  const LeastSquares p = Problem();
  const auto run = [&](const std::string& job, bool speculative,
                       std::vector<ServerProcess>& servers) -> std::vector<float> {
    const std::string config = absl::StrCat(
        R"({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1,
            "optimizer": {"type": "AdamW", "params": {"weight_decay": 0.01}},
            "gradient_clipping": 0.5, "zo": {"chunk_elems": 128, "client_lr": true,
            "speculative_update": )",
        speculative ? "true" : "false", "}}");
    ClientOptions grpc_only;
    grpc_only.shared_memory = false;
    auto workers = OpenWorkers(p, DType::kFloat32, job, config, Addresses(servers), grpc_only);
    EXPECT_THAT(workers.status(), IsOk());
    if (!workers.ok()) return {};
    for (auto& w : *workers) {
      w->set_step_lr([](int64_t step) { return 0.01 * std::min<int64_t>(step, 10) / 10; });
    }
    EXPECT_THAT((*workers)[0]->InitWeights(), IsOk());
    EXPECT_THAT(RunSteps(*workers, 1, 30), IsOk());
    auto x = (*workers)[0]->PullAll(30);
    EXPECT_THAT(x.status(), IsOk());
    return x.ok() ? *x : std::vector<float>{};
  };
  std::vector<ServerProcess> servers = StartServers(2);
  const std::vector<float> speculative = run("client-rates", true, servers);
  const std::vector<float> synchronous = run("client-rates-sync", false, servers);
  ASSERT_EQ(speculative.size(), static_cast<size_t>(p.n));
  ASSERT_EQ(synchronous.size(), speculative.size());
  EXPECT_EQ(std::memcmp(synchronous.data(), speculative.data(), speculative.size() * 4), 0);
  const v1::JobStatus follower = StatusOf(servers[1], "client-rates");
  EXPECT_EQ(follower.no_speculation(), "");
  EXPECT_GT(follower.speculated_chunks(), 0);
  EXPECT_GT(follower.confirmed_chunks(), 0) << "the follower's guesses never held";
}

// DeepSpeed's DynamicLossScaler, written from its documented semantics.
struct ScalerModel {
  double scale;
  int window, hysteresis;
  int64_t iteration = 0, last_overflow = -1;
  int hysteresis_left;
  ScalerModel(double s, int w, int h) : scale(s), window(w), hysteresis(h), hysteresis_left(h) {}
  void Update(bool overflow) {
    if (overflow) {
      if (hysteresis == 1 || hysteresis_left == 1) {
        scale = std::max(scale / 2, 1.0);
      } else {
        --hysteresis_left;
      }
      last_overflow = iteration;
    } else if ((iteration - last_overflow) % window == 0) {
      hysteresis_left = hysteresis;
      scale *= 2;
    }
    ++iteration;
  }
};

TEST(OffloadE2eTest, Fp16OverflowSkipsTheStepEverywhereAndFollowsDynamicLossScaling) {
  const LeastSquares p = Problem();
  std::vector<ServerProcess> servers = StartServers(2);
  const std::string config = ConfigJson(
      R"("fp16": {"enabled": true, "initial_scale_power": 8, "loss_scale_window": 4,
                  "hysteresis": 2, "min_loss_scale": 1},)");
  ZO_ASSERT_OK_AND_ASSIGN(auto workers,
                          OpenWorkers(p, DType::kFloat16, "fp16", config, Addresses(servers)));
  ASSERT_THAT(workers[0]->InitWeights(), IsOk());
  const std::set<int64_t> overflow = {3, 4, 5, 11, 20};
  const int steps = 24;

  ScalerModel model(256.0, 4, 2);
  Reference ref(p, {.clipping = 0.5, .dtype = DType::kFloat16});
  for (int s = 1; s <= steps; ++s) {
    const double scale = model.scale;
    ASSERT_THAT(RunSteps(workers, s, s, overflow), IsOk());
    EXPECT_EQ(workers[0]->scales().back(), scale) << "step " << s;
    {  // wait until step s is decided and applied
      std::vector<std::byte> buf(p.tensor_sizes[0] * 2);
      std::vector<absl::Span<std::byte>> dst = {absl::MakeSpan(buf)};
      ASSERT_THAT(workers[1]->client().Pull(s, s, std::vector<int>{0}, dst).status(), IsOk());
    }
    ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus st, workers[1]->client().JobStatus());
    EXPECT_EQ(st.last_skipped(), overflow.count(s) > 0) << "step " << s;
    ref.Step(s, overflow.count(s) > 0, scale);
    model.Update(overflow.count(s) > 0);
    EXPECT_EQ(st.loss_scale(), model.scale) << "after step " << s;
    if (overflow.count(s) > 0) {
      // Nothing changed: the pull of version s says so and sends no bytes.
      std::vector<std::byte> buf(p.tensor_sizes[0] * 2);
      std::vector<absl::Span<std::byte>> dst = {absl::MakeSpan(buf)};
      ZO_ASSERT_OK_AND_ASSIGN(const bool changed,
                              workers[0]->client().Pull(s, s - 1, std::vector<int>{0}, dst));
      EXPECT_FALSE(changed) << "step " << s;
    }
  }
  // Skipped steps left weights and moments alone: the trajectory matches the
  // reference that skips the same steps (fp16 weights: a rounding flip of a
  // weight changes the next gradient by ~2^-11 relative).
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<float> x, workers[0]->PullAll(steps));
  EXPECT_LT(MaxRelError(x, ref.master()), 2e-3);
}

TEST(OffloadE2eTest, DelayedParameterUpdateMatchesTheOneStepDelayedReference) {
  const LeastSquares p = Problem();
  std::vector<ServerProcess> servers = StartServers(2);
  const std::string config = ConfigJson("", R"(, "dpu": {"enabled": true, "warmup_steps": 3})");
  ZO_ASSERT_OK_AND_ASSIGN(auto workers,
                          OpenWorkers(p, DType::kFloat32, "dpu", config, Addresses(servers)));
  ASSERT_THAT(workers[0]->InitWeights(), IsOk());
  const int steps = 30;
  ASSERT_THAT(RunSteps(workers, 1, steps), IsOk());
  Reference ref(p, {.clipping = 0.5, .dpu = true, .dpu_warmup = 3});
  Reference undelayed(p, {.clipping = 0.5});
  for (int s = 1; s <= steps; ++s) {
    ref.Step(s, false, 1.0);
    undelayed.Step(s, false, 1.0);
  }
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<float> x, workers[0]->PullAll(steps));
  EXPECT_LT(MaxRelError(x, ref.master()), 1e-5);
  // And the delay is real: the undelayed trajectory is elsewhere.
  EXPECT_GT(MaxRelError(x, undelayed.master()), 1e-4);
}

TEST(OffloadE2eTest, CheckpointOnTwoServersRestoresOntoThreeIdentically) {
  const LeastSquares p = Problem();
  const std::string ckpt = FreshTempDir("e2e_ckpt_2to3");
  std::string path;
  {
    std::vector<ServerProcess> servers = StartServers(2, {"--checkpoint-dir", ckpt});
    ZO_ASSERT_OK_AND_ASSIGN(auto workers, OpenWorkers(p, DType::kFloat32, "resharded", ConfigJson(),
                                                      Addresses(servers)));
    ASSERT_THAT(workers[0]->InitWeights(), IsOk());
    ASSERT_THAT(RunSteps(workers, 1, 20), IsOk());
    ZO_ASSERT_OK_AND_ASSIGN(path, workers[0]->client().Checkpoint(20));
    EXPECT_THAT(path, HasSubstr("step-"));
  }
  std::vector<ServerProcess> servers = StartServers(3, {"--checkpoint-dir", ckpt});
  ZO_ASSERT_OK_AND_ASSIGN(
      auto workers, OpenWorkers(p, DType::kFloat32, "resharded", ConfigJson(), Addresses(servers)));
  ZO_ASSERT_OK_AND_ASSIGN(const int64_t version, workers[0]->client().Restore(path));
  EXPECT_EQ(version, 20);
  ASSERT_THAT(RunSteps(workers, 21, kSteps), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<float> x, workers[1]->PullAll(kSteps));
  // Element-wise Adam and a norm summed in chunk order do not depend on the
  // server count: bit for bit the uninterrupted run.
  EXPECT_EQ(x, UninterruptedWeights());
}

// With a delayed parameter update the step after a checkpoint computes on
// the version before it: the checkpoint keeps those weights, so a restore
// (onto another server count) continues the trajectory bit for bit.
TEST(OffloadE2eTest, DelayedParameterUpdateRestoresOntoTheSameTrajectory) {
  const LeastSquares p = Problem();
  const std::string ckpt = FreshTempDir("e2e_ckpt_dpu");
  const std::string config = ConfigJson("", R"(, "dpu": {"enabled": true, "warmup_steps": 3})");
  std::string path;
  std::vector<float> uninterrupted;
  {
    std::vector<ServerProcess> servers = StartServers(2, {"--checkpoint-dir", ckpt});
    ZO_ASSERT_OK_AND_ASSIGN(
        auto workers, OpenWorkers(p, DType::kFloat32, "dpu_restore", config, Addresses(servers)));
    ASSERT_THAT(workers[0]->InitWeights(), IsOk());
    ASSERT_THAT(RunSteps(workers, 1, 20), IsOk());
    ZO_ASSERT_OK_AND_ASSIGN(path, workers[0]->client().Checkpoint(20));
    ASSERT_THAT(RunSteps(workers, 21, 30), IsOk());
    ZO_ASSERT_OK_AND_ASSIGN(uninterrupted, workers[0]->PullAll(30));
  }
  ZO_ASSERT_OK_AND_ASSIGN(const CheckpointMeta meta, ReadCheckpointMeta(path));
  EXPECT_TRUE(meta.has_previous);
  EXPECT_EQ(meta.previous_version, 19);
  EXPECT_FALSE(meta.previous_same_data);

  std::vector<ServerProcess> servers = StartServers(3, {"--checkpoint-dir", ckpt});
  ZO_ASSERT_OK_AND_ASSIGN(
      auto workers, OpenWorkers(p, DType::kFloat32, "dpu_restore", config, Addresses(servers)));
  ZO_ASSERT_OK_AND_ASSIGN(const int64_t version, workers[0]->client().Restore(path));
  EXPECT_EQ(version, 20);
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus st, workers[1]->client().JobStatus());
  EXPECT_EQ(st.base_version(), 19) << "the version step 21 computes on is held";
  ASSERT_THAT(RunSteps(workers, 21, 30), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<float> x, workers[0]->PullAll(30));
  EXPECT_EQ(x, uninterrupted);
}

TEST(OffloadE2eTest, KilledFollowerFailsClientsFastAndItsLeadRollsBackExactly) {
  const LeastSquares p = Problem();
  const std::string ckpt = FreshTempDir("e2e_ckpt_kill");
  std::vector<ServerProcess> servers = StartServers(2, {"--checkpoint-dir", ckpt});
  const std::vector<std::string> addresses = Addresses(servers);
  ClientOptions options;
  options.call_timeout = absl::Seconds(10);
  options.retry_for = absl::Seconds(2);
  {
    ZO_ASSERT_OK_AND_ASSIGN(
        auto workers, OpenWorkers(p, DType::kFloat32, "kill", ConfigJson(), addresses, options));
    ASSERT_THAT(workers[0]->InitWeights(), IsOk());
    ASSERT_THAT(RunSteps(workers, 1, 20), IsOk());
    ASSERT_THAT(workers[0]->client().Checkpoint(20).status(), IsOk());
    ASSERT_THAT(RunSteps(workers, 21, 25), IsOk());

    // Step 26 onwards while server 1 dies under it: rank 0 kills it in the
    // middle of step 26, its gradients pushed and their acks not yet waited
    // for. Both ranks must then fail (a hang would end in the test timeout).
    workers[0]->set_after_push([&](int64_t step) {
      if (step == 26) servers[1].Kill();
    });
    const absl::Status run = RunSteps(workers, 26, kSteps);
    workers[0]->set_after_push(nullptr);
    EXPECT_FALSE(run.ok());
    EXPECT_THAT(std::string(run.message()), ::testing::ContainsRegex("rank 0 step 2[67]: "));
    // The survivor still answers.
    ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus st, workers[0]->client().JobStatus());
    EXPECT_GE(st.version(), 25);
  }
  // Restart on the same address and re-attach: server 1 came back without
  // the job, and never re-creates its part at version 0 for a worker (it
  // says so, UNAVAILABLE, while its lead holds the job trained); the lead
  // rolls every server back to the last checkpoint by itself, and the
  // workers' open goes through once it has.
  ZO_ASSERT_OK_AND_ASSIGN(servers[1],
                          ServerProcess::Start({"--checkpoint-dir", ckpt}, servers[1].port()));
  options.retry_for = absl::Minutes(1);
  ZO_ASSERT_OK_AND_ASSIGN(
      auto workers, OpenWorkers(p, DType::kFloat32, "kill", ConfigJson(), addresses, options));
  EXPECT_EQ(workers[0]->client().version(), 20);
  EXPECT_EQ(workers[1]->client().version(), 20);
  ASSERT_THAT(RunSteps(workers, 21, kSteps), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<float> x, workers[0]->PullAll(kSteps));
  EXPECT_EQ(x, UninterruptedWeights());
}

// A step whose push to one server fails ends with that server's error at
// once, even while another server holds its push for the step before (here
// waiting for rank 1's gradients of step 6, which never come; in the field
// a follower whose lead died holds it the same way). Before, the worker
// waited out the held call's deadline before it could look for the job
// again; with this test's 30-minute deadline that is the ctest timeout.
TEST(OffloadE2eTest, AFailedPushEndsTheStepWithoutWaitingForTheOtherServers) {
  const LeastSquares p = Problem();
  std::vector<ServerProcess> servers = StartServers(2);
  const std::string config = ConfigJson("", R"(, "dpu": {"enabled": true, "warmup_steps": 3})");
  ClientOptions options;
  options.call_timeout = absl::Minutes(30);
  options.retry_for = absl::Seconds(1);
  ZO_ASSERT_OK_AND_ASSIGN(
      auto workers, OpenWorkers(p, DType::kFloat32, "held", config, Addresses(servers), options));
  ASSERT_THAT(workers[0]->InitWeights(), IsOk());
  ASSERT_THAT(RunSteps(workers, 1, 5), IsOk());
  ASSERT_THAT(workers[0]->RunStep(6, false), IsOk());  // rank 1 never pushes step 6

  const std::vector<float> zeros(p.tensor_sizes[0], 0.0f);
  const std::vector<std::byte> bytes = FromFloats(DType::kFloat32, zeros.data(), zeros.size());
  OffloadClient& client = workers[0]->client();
  // Step 5's update (DPU: behind the pushes of step 6) is done before the
  // job's version is read; step 6's never comes.
  std::vector<std::byte> weights(p.tensor_sizes[0] * sizeof(float));
  const std::vector<absl::Span<std::byte>> dst = {absl::MakeSpan(weights)};
  ASSERT_THAT(client.Pull(5, -1, {0}, dst).status(), IsOk());
  ASSERT_THAT(client.Push(7, 0, bytes), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus held, client.JobStatus());
  servers[1].Kill();
  const absl::Status finished = client.FinishStep(7);
  EXPECT_EQ(finished.code(), absl::StatusCode::kUnavailable) << finished;
  if (!RewordErrorsForTesting()) {
    EXPECT_THAT(std::string(finished.message()), HasSubstr(servers[1].address()));
  }
  EXPECT_EQ(held.version(), 5);
}

// A worker that dies after delivering part of a step, restarted with
// `resend`: the servers skip what they already have, take the rest, and the
// run is bit for bit the uninterrupted one (docs/architecture.md: "a restarted worker
// re-attaches and re-sends the step").
TEST(OffloadE2eTest, RestartedWorkerResendsAPartlyDeliveredStep) {
  const LeastSquares p = Problem();
  std::vector<ServerProcess> servers = StartServers(2);
  const std::vector<std::string> addresses = Addresses(servers);
  ZO_ASSERT_OK_AND_ASSIGN(auto workers,
                          OpenWorkers(p, DType::kFloat32, "resend", ConfigJson(), addresses));
  ASSERT_THAT(workers[0]->InitWeights(), IsOk());
  ASSERT_THAT(RunSteps(workers, 1, 10), IsOk());

  // Rank 0 pushes the first 150 elements of tensor 0 for step 11 and dies.
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<float> v10, workers[0]->PullAll(10));
  const std::vector<double> g = p.Gradient(0, v10);
  std::vector<float> g0(g.begin(), g.begin() + 150);
  ASSERT_THAT(workers[0]->client().PushRange(11, 0, 0, FromFloats(DType::kFloat32, g0.data(), 150)),
              IsOk());
  workers[0].reset();  // the destructor ends its open push call

  // Its replacement re-sends the whole step; rank 1 sends its own.
  ClientOptions options;
  options.job = "resend";
  options.servers = addresses;
  options.dp_rank = 0;
  options.dp_world_size = 2;
  options.resend = true;
  ZO_ASSERT_OK_AND_ASSIGN(
      auto client, OffloadClient::Open(options, ConfigJson(), ManifestOf(p, DType::kFloat32)));
  EXPECT_EQ(client->version(), 10);
  workers[0] = std::make_unique<Worker>(p, 0, DType::kFloat32, std::move(client));
  ASSERT_THAT(RunSteps(workers, 11, 11), IsOk());
  ASSERT_THAT(RunSteps(workers, 12, kSteps), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<float> x, workers[1]->PullAll(kSteps));
  EXPECT_EQ(x, UninterruptedWeights());
}

}  // namespace
}  // namespace zo::testing
