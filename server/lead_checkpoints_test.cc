// LeadCheckpoints with a job whose own part is a real part file
// (checkpoint_test_util.h) and whose step loop is the test: when a request
// is due, what Run commits on disk, the freeze, a failure kept for
// JobStatus and cleared by the next success, the finish on its own thread
// while the steps go on, pruning, and the refusals; then the round across
// a follower that is a real zo-server reached by the peer calls, and one
// that is down.
#include "server/lead_checkpoints.h"

#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/checkpoint/checkpoint_test_util.h"
#include "rpc/error_detail.h"
#include "rpc/proto_convert.h"
#include "server/lead_test_servers.h"
#include "server/offload_server.h"
#include "server/peer_client.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

constexpr char kJob[] = "ck";

// The job's side: its state, a part it writes for real, and what it was asked.
class FakeJob {
 public:
  // The job's manifest: one fp16 tensor of 100 elements in chunks of 64.
  FakeJob(std::string root, int num_servers)
      : root_(std::move(root)),
        state_(testing::MakeFlatState({{"w", {100}, DType::kFloat16}}, /*chunk_elems=*/64,
                                      num_servers, /*seed=*/3)) {}

  CheckpointActions Actions() {
    return {
        .describe =
            [this](int64_t version, CheckpointMeta& meta) {
              meta = testing::TestMeta(kJob, version, state_);
              return uint32_t{0};
            },
        .begin_own_part =
            [this](int64_t version, const std::string&, uint32_t) {
              std::lock_guard lock(mu_);
              begun_.push_back(version);
              return begin_result_;
            },
        .finish_own_part = [this](int64_t, const std::string& dir)
            -> absl::StatusOr<v1::WriteCheckpointPartResponse> {
          {
            std::unique_lock lock(mu_);
            cv_.wait(lock, [&] { return !hold_finish_; });
          }
          ZO_ASSIGN_OR_RETURN(CheckpointPartSummary part, testing::WriteTestPart(dir, state_, 0));
          v1::WriteCheckpointPartResponse response;
          response.set_file(part.file);
          response.set_bytes(part.bytes);
          response.set_index_checksum(absl::StrFormat("%016x", part.index_checksum));
          return response;
        },
        .drop_own_part =
            [this](const absl::Status& why) {
              std::lock_guard lock(mu_);
              dropped_.push_back(why);
            },
        .wake =
            [this] {
              std::lock_guard lock(mu_);
              ++wakes_;
              cv_.notify_all();
            },
        .heard =
            [this](int server, const absl::Status& answer) {
              std::lock_guard lock(mu_);
              heard_.emplace_back(server, answer);
            },
    };
  }

  void set_begin_result(absl::Status s) {
    std::lock_guard lock(mu_);
    begin_result_ = std::move(s);
  }
  void HoldFinish(bool hold) {
    std::lock_guard lock(mu_);
    hold_finish_ = hold;
    cv_.notify_all();
  }
  // Waits until the step loop has been woken more than `n` times.
  int AwaitWakesAbove(int n) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return wakes_ > n; });
    return wakes_;
  }
  int wakes() {
    std::lock_guard lock(mu_);
    return wakes_;
  }
  const testing::FlatState& state() const { return state_; }
  std::vector<absl::Status> dropped() {
    std::lock_guard lock(mu_);
    return dropped_;
  }
  // The followers' answers the job's recovery heard, in order.
  std::vector<std::pair<int, absl::Status>> heard() {
    std::lock_guard lock(mu_);
    return heard_;
  }
  // The job's checkpoint directories left under the root, committed or not.
  std::vector<std::string> Dirs() const {
    std::vector<std::string> out;
    const std::filesystem::path job_dir = std::filesystem::path(root_) / kJob;
    if (!std::filesystem::exists(job_dir)) return out;
    for (const auto& e : std::filesystem::directory_iterator(job_dir)) {
      out.push_back(e.path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  const std::string root_;
  const testing::FlatState state_;
  std::mutex mu_;
  std::condition_variable cv_;
  absl::Status begin_result_;
  bool hold_finish_ = false;
  std::vector<int64_t> begun_;
  std::vector<absl::Status> dropped_;
  std::vector<std::pair<int, absl::Status>> heard_;
  int wakes_ = 0;
};

class LeadCheckpointsTest : public ::testing::Test {
 protected:
  LeadCheckpointsTest()
      : root_(testing::FreshTestDir("lead_checkpoints")),
        job_(root_, /*num_servers=*/1),
        checkpoints_(std::make_unique<LeadCheckpoints>(Options(), job_.Actions())) {}
  ~LeadCheckpointsTest() override { std::filesystem::remove_all(root_); }

  LeadCheckpoints::Options Options(int keep = 0) const {
    return {.job = kJob, .servers = {"lead:1"}, .root = root_, .keep = keep};
  }
  // A request on its own thread, once it is waiting (it wakes the step loop).
  std::thread Ask(int64_t min_version, absl::StatusOr<v1::CheckpointResponse>* out,
                  bool freeze = false) {
    const int wakes = job_.wakes();
    std::thread asker([this, min_version, out, freeze] {
      *out = checkpoints_->Request(min_version, absl::InfiniteFuture(), freeze);
    });
    job_.AwaitWakesAbove(wakes);
    return asker;
  }

  const std::string root_;
  FakeJob job_;
  std::unique_ptr<LeadCheckpoints> checkpoints_;
};

TEST_F(LeadCheckpointsTest, ARequestIsDueAtItsVersionAndRunCommitsIt) {
  absl::StatusOr<v1::CheckpointResponse> answer;
  std::thread asker = Ask(3, &answer);
  EXPECT_EQ(checkpoints_->waiting(), 1u);
  EXPECT_FALSE(checkpoints_->Due(2, /*healthy=*/true));
  ASSERT_TRUE(checkpoints_->Due(3, /*healthy=*/true));
  checkpoints_->Run(3, /*generation=*/0, absl::OkStatus());
  asker.join();
  ASSERT_THAT(answer.status(), IsOk());
  EXPECT_EQ(answer->version(), 3);
  ZO_ASSERT_OK_AND_ASSIGN(const CheckpointMeta meta, ReadCheckpointMeta(answer->path()));
  EXPECT_EQ(meta.version, 3);
  ASSERT_EQ(meta.parts.size(), 1u);
  EXPECT_THAT(LatestCheckpoint(root_, kJob), testing::IsOkAndHolds(answer->path()));

  v1::JobStatus status;
  checkpoints_->AddTo(status);
  EXPECT_EQ(status.last_checkpoint_step(), 3);
  EXPECT_EQ(status.checkpoint_failures(), 0);
  EXPECT_FALSE(status.frozen());
  EXPECT_EQ(checkpoints_->waiting(), 0u);
  EXPECT_FALSE(checkpoints_->Due(10, /*healthy=*/true));
}

TEST_F(LeadCheckpointsTest, AnUnhealthyJobFailsItsRequestsWithItsHealthAndWritesNothing) {
  absl::StatusOr<v1::CheckpointResponse> answer;
  std::thread asker = Ask(8, &answer);
  ASSERT_TRUE(checkpoints_->Due(2, /*healthy=*/false));
  checkpoints_->Run(2, 0, absl::FailedPreconditionError("job ck needs restore: step 2 failed"));
  asker.join();
  EXPECT_THAT(answer.status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("needs restore")));
  EXPECT_THAT(job_.Dirs(), IsEmpty());
}

TEST_F(LeadCheckpointsTest, AFreezeHoldsAfterTheCommitUntilThawed) {
  absl::StatusOr<v1::CheckpointResponse> answer;
  std::thread asker = Ask(1, &answer, /*freeze=*/true);
  EXPECT_FALSE(checkpoints_->frozen());
  checkpoints_->Run(1, 0, absl::OkStatus());
  // Finished before Run returned: the step loop takes no step past it.
  EXPECT_FALSE(checkpoints_->running());
  asker.join();
  ASSERT_THAT(answer.status(), IsOk());
  EXPECT_TRUE(checkpoints_->frozen());
  const int wakes = job_.wakes();
  EXPECT_TRUE(checkpoints_->Thaw());
  EXPECT_GT(job_.wakes(), wakes);
  EXPECT_FALSE(checkpoints_->frozen());
  EXPECT_FALSE(checkpoints_->Thaw());
}

TEST_F(LeadCheckpointsTest, AFailureIsKeptForStatusLeavesNoDirectoryAndTheNextSuccessClearsIt) {
  job_.set_begin_result(absl::ResourceExhaustedError("No space left on device"));
  absl::StatusOr<v1::CheckpointResponse> answer;
  std::thread asker = Ask(4, &answer);
  checkpoints_->Run(4, 0, absl::OkStatus());
  asker.join();
  EXPECT_THAT(answer.status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("No space")));
  v1::JobStatus status;
  checkpoints_->AddTo(status);
  EXPECT_EQ(status.checkpoint_failures(), 1);
  EXPECT_EQ(status.last_checkpoint_error(), "step 4: No space left on device");
  EXPECT_EQ(status.last_checkpoint_step(), -1);
  EXPECT_THAT(job_.Dirs(), IsEmpty());

  job_.set_begin_result(absl::OkStatus());
  std::thread again = Ask(5, &answer);
  checkpoints_->Run(5, 0, absl::OkStatus());
  again.join();
  ASSERT_THAT(answer.status(), IsOk());
  checkpoints_->AddTo(status);
  EXPECT_EQ(status.checkpoint_failures(), 1);
  EXPECT_EQ(status.last_checkpoint_error(), "");
  EXPECT_EQ(status.last_checkpoint_step(), 5);
}

TEST_F(LeadCheckpointsTest, TheFinishRunsOnItsOwnThreadWhileTheStepsGoOn) {
  job_.HoldFinish(true);
  absl::StatusOr<v1::CheckpointResponse> answer;
  std::thread asker = Ask(2, &answer);
  checkpoints_->Run(2, 0, absl::OkStatus());  // returns with the part begun
  EXPECT_TRUE(checkpoints_->running());
  // A second request is not due while one is being finished.
  absl::StatusOr<v1::CheckpointResponse> second;
  std::thread asker2 = Ask(2, &second);
  EXPECT_FALSE(checkpoints_->Due(3, /*healthy=*/true));
  const int wakes = job_.wakes();
  job_.HoldFinish(false);
  asker.join();
  ASSERT_THAT(answer.status(), IsOk());
  job_.AwaitWakesAbove(wakes);  // the step loop hears the checkpoint ended
  EXPECT_FALSE(checkpoints_->running());
  ASSERT_TRUE(checkpoints_->Due(3, /*healthy=*/true));
  checkpoints_->Run(3, 0, absl::OkStatus());
  asker2.join();
  ASSERT_THAT(second.status(), IsOk());
  EXPECT_EQ(second->version(), 3);
}

TEST_F(LeadCheckpointsTest, PruningKeepsTheNewestOnes) {
  checkpoints_ = std::make_unique<LeadCheckpoints>(Options(/*keep=*/2), job_.Actions());
  for (int64_t version : {1, 2, 3}) {
    absl::StatusOr<v1::CheckpointResponse> answer;
    std::thread asker = Ask(version, &answer);
    checkpoints_->Run(version, 0, absl::OkStatus());
    asker.join();
    ASSERT_THAT(answer.status(), IsOk());
    checkpoints_->Join();  // the pruning ran on the finishing thread
  }
  EXPECT_EQ(job_.Dirs().size(), 2u);
  EXPECT_THAT(LatestCheckpoint(root_, kJob),
              testing::IsOkAndHolds(HasSubstr(absl::StrCat(CheckpointDirName(3)))));
}

TEST_F(LeadCheckpointsTest, WaitingRequestsFailOnARestoreAndAStoppedOneRefuses) {
  absl::StatusOr<v1::CheckpointResponse> answer;
  std::thread asker = Ask(9, &answer);
  checkpoints_->FailWaiting([](int64_t min_version) {
    return absl::AbortedError(absl::StrCat("restored while ", min_version, " waited"));
  });
  asker.join();
  EXPECT_THAT(answer.status(), StatusIs(absl::StatusCode::kAborted, "restored while 9 waited"));
  checkpoints_->Restored(7);
  v1::JobStatus status;
  checkpoints_->AddTo(status);
  EXPECT_EQ(status.last_checkpoint_step(), 7);

  std::thread stopped = Ask(12, &answer);
  checkpoints_->Stop();
  stopped.join();
  EXPECT_THAT(answer.status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
  EXPECT_THAT(checkpoints_->Request(12, absl::InfiniteFuture()).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
}

TEST_F(LeadCheckpointsTest, BadRequestsAreRefused) {
  EXPECT_THAT(checkpoints_->Request(-1, absl::InfiniteFuture()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  EXPECT_THAT(checkpoints_->Request(1, absl::Now()).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("will still be committed")));
  LeadCheckpoints off({.job = kJob, .servers = {"lead:1"}, .root = "", .keep = 0}, job_.Actions());
  EXPECT_THAT(off.Request(1, absl::InfiniteFuture()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("--checkpoint-dir")));
}

// The lead's slot holds a second server without the job: the follower asks
// it before creating its part, and it answers that it has none.
class LeadCheckpointsWithAFollowerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_THAT(servers_.Start(kJob), IsOk());
    checkpoints_ =
        std::make_unique<LeadCheckpoints>(LeadCheckpoints::Options{.job = kJob,
                                                                   .servers = servers_.addresses,
                                                                   .peers = &peers_,
                                                                   .peer_timeout = absl::Seconds(3),
                                                                   .root = root_,
                                                                   .keep = 0},
                                          job_.Actions());
  }
  void TearDown() override {
    checkpoints_.reset();
    servers_.Stop();
    std::filesystem::remove_all(root_);
  }

  absl::StatusOr<v1::CheckpointResponse> CheckpointVersion0() {
    absl::StatusOr<v1::CheckpointResponse> answer;
    const int wakes = job_.wakes();
    std::thread asker([&] { answer = checkpoints_->Request(0, absl::Now() + absl::Seconds(60)); });
    job_.AwaitWakesAbove(wakes);
    checkpoints_->Run(0, /*generation=*/0, absl::OkStatus());
    asker.join();
    return answer;
  }

  const std::string root_ = testing::FreshTestDir("lead_checkpoints_follower");
  testing::LeadTestServers servers_;
  PeerClient peers_{PeerCredentials{}};
  FakeJob job_{root_, /*num_servers=*/2};
  std::unique_ptr<LeadCheckpoints> checkpoints_;
};

TEST_F(LeadCheckpointsWithAFollowerTest, TheFollowersPartIsWrittenOverItsPeerCallsAndCommitted) {
  ZO_ASSERT_OK_AND_ASSIGN(const v1::CheckpointResponse answer, CheckpointVersion0());
  ZO_ASSERT_OK_AND_ASSIGN(const CheckpointMeta meta, ReadCheckpointMeta(answer.path()));
  ASSERT_EQ(meta.parts.size(), 2u);
  EXPECT_EQ(meta.parts[1].file, CheckpointPartFileName(1));
  // Both parts are whole: every chunk reads back, each block's checksum
  // checked.
  ZO_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(answer.path()));
  std::vector<float> master(100), m(100), v(100);
  ASSERT_THAT(reader->ReadFlat(0, absl::MakeSpan(master), absl::MakeSpan(m), absl::MakeSpan(v)),
              IsOk());
  // Chunk 0 is the lead's part, as its job wrote it.
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(master[i], job_.state().master[i]) << i;
  EXPECT_TRUE(job_.dropped().empty());
  // The recovery heard the follower answer both calls.
  const auto heard = job_.heard();
  ASSERT_EQ(heard.size(), 2u);
  for (const auto& [server, answer] : heard) {
    EXPECT_EQ(server, 1);
    EXPECT_THAT(answer, IsOk());
  }
}

// A follower that restarted without the job answers NO_JOB: the checkpoint
// fails, and the lead's recovery hears it then (it rolls the job back at
// once instead of at its next probe).
TEST_F(LeadCheckpointsWithAFollowerTest, AFollowerWithoutTheJobIsHeardByTheRecovery) {
  ZO_ASSERT_OK_AND_ASSIGN(std::unique_ptr<OffloadServer> restarted, testing::StartLoopbackServer());
  checkpoints_ = std::make_unique<LeadCheckpoints>(
      LeadCheckpoints::Options{
          .job = kJob,
          .servers = {servers_.addresses[0], testing::LoopbackAddress(*restarted)},
          .peers = &peers_,
          .peer_timeout = absl::Seconds(3),
          .root = root_,
          .keep = 0},
      job_.Actions());
  EXPECT_THAT(CheckpointVersion0().status(), Not(IsOk()));
  const auto heard = job_.heard();
  ASSERT_EQ(heard.size(), 1u);
  EXPECT_EQ(heard[0].first, 1);
  EXPECT_EQ(ReasonOf(heard[0].second), v1::ErrorDetail::NO_JOB) << heard[0].second;
  EXPECT_THAT(job_.Dirs(), IsEmpty());
  checkpoints_.reset();
  restarted->Shutdown(absl::ZeroDuration());
}

TEST_F(LeadCheckpointsWithAFollowerTest, AFollowerThatIsDownFailsTheCheckpointAndLeavesNothing) {
  servers_.follower->Shutdown(absl::ZeroDuration());
  const absl::StatusOr<v1::CheckpointResponse> answer = CheckpointVersion0();
  EXPECT_THAT(answer.status(), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  // The lead's own part, begun first, is dropped; no directory is left.
  ASSERT_EQ(job_.dropped().size(), 1u);
  EXPECT_THAT(job_.dropped()[0], StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  v1::JobStatus status;
  checkpoints_->AddTo(status);
  EXPECT_EQ(status.checkpoint_failures(), 1);
  EXPECT_THAT(job_.Dirs(), IsEmpty());
}

}  // namespace
}  // namespace zo
