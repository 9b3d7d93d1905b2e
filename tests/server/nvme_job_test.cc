// A job whose optimizer state lives on NVMe swap files, through real
// zo-server processes: the same trajectory as the RAM-resident run, and a
// corrupted swap file puts the job in "needs restore" (never silent
// corruption) until a checkpoint is restored.
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "rpc/rpc_util.h"
#include "tests/server/least_squares.h"
#include "tests/server/server_process.h"
#include "tests/server/training_harness.h"

namespace zo::testing {
namespace {

using ::testing::HasSubstr;

// The e2e tests' problem and optimizer; optimizer state in sub-groups of 100
// elements (not a multiple of 4 KiB of state), all on NVMe (memory budget 0).
std::string Config(const std::string& nvme_path, bool nvme, const std::string& dpu = "") {
  return ReferenceJobConfig(absl::StrCat(R"("zero_optimization": {"sub_group_size": 100,
                          "offload_optimizer": {"device": ")",
                                         nvme ? "nvme" : "cpu", R"(", "nvme_path": ")", nvme_path,
                                         R"("}}, "zo": {"chunk_elems": 128 )", dpu, "}"));
}

LeastSquares Problem() { return ReferenceProblem(); }

std::vector<float> Train(const std::string& config, int steps,
                         const std::vector<std::string>& server_args = {}) {
  const LeastSquares p = Problem();
  std::vector<ServerProcess> servers = StartServers(2, server_args);
  auto workers = OpenWorkers(p, DType::kFloat32, "ram", config, Addresses(servers));
  EXPECT_THAT(workers.status(), IsOk());
  EXPECT_THAT((*workers)[0]->InitWeights(), IsOk());
  EXPECT_THAT(RunSteps(*workers, 1, steps), IsOk());
  auto x = (*workers)[0]->PullAll(steps);
  EXPECT_THAT(x.status(), IsOk());
  return x.ok() ? *x : std::vector<float>{};
}

TEST(NvmeJobTest, RamOnlyJobOverTheMemoryBudgetIsRefusedAtOpen) {
  const LeastSquares p = Problem();
  std::vector<ServerProcess> servers = StartServers(1, {"--memory-budget", "1Ki"});
  EXPECT_THAT(
      OpenWorkers(p, DType::kFloat32, "big", Config("", false), Addresses(servers)).status(),
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr("offload_optimizer.device to \"nvme\"")));
}

// With the delayed update, step t+1's gradients arrive while step t's update
// streams the NVMe sub-groups; each chunk takes them as soon as its own
// update is done. Any gradient let in too early (or zeroed too late) would
// show in the trajectory.
TEST(NvmeJobTest, DelayedUpdateOverNvmeStateMatchesTheRamRun) {
  const std::string dpu = R"(, "dpu": {"enabled": true, "warmup_steps": 2})";
  const std::vector<float> ram = Train(Config("", false, dpu), 25);
  const std::vector<float> nvme =
      Train(Config(FreshTempDir("nvme_job_dpu_swap"), true, dpu), 25, {"--memory-budget", "0"});
  ASSERT_EQ(nvme.size(), ram.size());
  EXPECT_EQ(nvme, ram);
}

TEST(NvmeJobTest, NvmeResidentStateCorruptionNeedsRestoreAndRestoreResumesExactly) {
  const LeastSquares p = Problem();
  const std::string nvme = FreshTempDir("nvme_job_swap");
  const std::string ckpt = FreshTempDir("nvme_job_ckpt");
  const std::string config = Config(nvme, true);
  const std::vector<float> ram = Train(Config("", false), 30);

  std::vector<ServerProcess> servers =
      StartServers(2, {"--memory-budget", "0", "--checkpoint-dir", ckpt});
  ClientOptions options;
  options.call_timeout = absl::Seconds(5);
  ZO_ASSERT_OK_AND_ASSIGN(
      auto workers, OpenWorkers(p, DType::kFloat32, "nvme", config, Addresses(servers), options));
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus st, workers[0]->client().JobStatus());
  EXPECT_EQ(st.nvme_elems(), st.local_elems()) << "memory budget 0: everything on NVMe";
  ASSERT_THAT(workers[0]->InitWeights(), IsOk());
  ASSERT_THAT(RunSteps(workers, 1, 10), IsOk());
  ASSERT_THAT(workers[0]->client().Checkpoint(10).status(), IsOk());
  ASSERT_THAT(RunSteps(workers, 11, 15), IsOk());
  ASSERT_THAT(workers[0]->PullAll(15).status(), IsOk());  // step 15 applied and written back

  // Flip one byte of the lead's swap file (a plain buffered write; the
  // server's O_DIRECT read flushes it first and sees it).
  const std::filesystem::path swap =
      std::filesystem::path(nvme) / "nvme.server0" / "optimizer_state.swap";
  ASSERT_TRUE(std::filesystem::exists(swap)) << swap;
  {
    std::fstream f(swap, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    char c = 0;
    f.read(&c, 1);
    f.seekp(100);
    c = static_cast<char>(c ^ 0x5a);
    f.write(&c, 1);
  }
  // Step 16's gradients are accepted; its update reads the corrupted block
  // and fails; from then on the job refuses steps with a clear status.
  const absl::Status run = RunSteps(workers, 16, 18);
  EXPECT_THAT(run, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("needs restore")));
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus broken, workers[0]->client().JobStatus());
  EXPECT_THAT(broken.needs_restore(), HasSubstr("checksum"));
  EXPECT_EQ(broken.version(), 15);

  // Restore the checkpoint of step 10 and train on: bit for bit the run whose
  // state never left RAM.
  ZO_ASSERT_OK_AND_ASSIGN(
      auto resumed, OpenWorkers(p, DType::kFloat32, "nvme", config, Addresses(servers), options));
  workers.clear();
  ZO_ASSERT_OK_AND_ASSIGN(const int64_t version, resumed[0]->client().Restore(""));
  EXPECT_EQ(version, 10);
  ASSERT_THAT(RunSteps(resumed, 11, 30), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<float> x, resumed[0]->PullAll(30));
  EXPECT_EQ(x, ram);
}

// A rollback restores the lead's part, then each follower's. Until the last
// one is back the lead must still read as restoring: a worker that found it
// healthy resumes at the restored version and pulls it from a follower that
// holds only the old ones (the chaos soak's "version 70 is not held (latest
// is 73)"). The follower's disk is slowed so its part takes a while.
TEST(NvmeJobTest, TheLeadReadsRestoringUntilEveryFollowerHasItsPart) {
  const LeastSquares p = Problem();
  const std::string ckpt = FreshTempDir("nvme_job_restoring_ckpt");
  const std::string config = Config(FreshTempDir("nvme_job_restoring_swap"), true);
  std::vector<ServerProcess> servers;
  for (const char* latency : {"0", "40ms"}) {
    ZO_ASSERT_OK_AND_ASSIGN(ServerProcess s,
                            ServerProcess::Start({"--memory-budget", "0", "--checkpoint-dir", ckpt,
                                                  "--inject-nvme-latency", latency}));
    servers.push_back(std::move(s));
  }
  ZO_ASSERT_OK_AND_ASSIGN(auto workers,
                          OpenWorkers(p, DType::kFloat32, "restoring", config, Addresses(servers)));
  ASSERT_THAT(workers[0]->InitWeights(), IsOk());
  ASSERT_THAT(RunSteps(workers, 1, 4), IsOk());
  ASSERT_THAT(workers[0]->client().Checkpoint(4).status(), IsOk());
  ASSERT_THAT(RunSteps(workers, 5, 7), IsOk());
  ASSERT_THAT(workers[0]->PullAll(7).status(), IsOk());

  const auto status_of = [&](int server) -> absl::StatusOr<v1::JobStatus> {
    auto stub = v1::Offload::NewStub(
        grpc::CreateChannel(Addresses(servers)[server], grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    v1::GetJobStatusRequest request;
    request.set_job("restoring");
    v1::JobStatus status;
    ZO_RETURN_IF_ERROR(FromGrpcStatus(stub->GetJobStatus(&context, request, &status)));
    return status;
  };
  std::atomic<bool> done{false};
  absl::StatusOr<int64_t> restored;
  std::thread restorer([&] {
    restored = workers[0]->client().Restore("", /*rollback=*/true);
    done = true;
  });
  int healthy_samples = 0;
  while (!done) {
    absl::StatusOr<v1::JobStatus> lead = status_of(0);
    if (!lead.ok() || !lead->needs_restore().empty() || lead->version() != 4) continue;
    // The lead reads as restored: so must the follower.
    ++healthy_samples;
    ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus follower, status_of(1));
    EXPECT_EQ(follower.version(), 4);
    EXPECT_EQ(follower.needs_restore(), "");
  }
  restorer.join();
  ASSERT_THAT(restored.status(), IsOk());
  EXPECT_EQ(*restored, 4);
  std::printf("lead sampled healthy %d times before the restore call returned\n", healthy_samples);
}

}  // namespace
}  // namespace zo::testing
