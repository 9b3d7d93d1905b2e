#include "server/step_coordinator.h"

#include <atomic>
#include <cmath>
#include <optional>
#include <thread>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using testing::IsOk;
using testing::StatusIs;

// 40 elements in chunks of 10 over 2 servers: chunks 0 and 2 on the lead,
// 1 and 3 on the follower.
ShardMap TwoServerMap() {
  return *ShardMap::Create({{.name = "w", .shape = {40}, .dtype = DType::kFloat32}}, 10, 2);
}

Config ParsedConfig(const std::string& extra = "") {
  absl::StatusOr<LoadedConfig> loaded =
      ParseConfig(absl::StrCat(R"({"train_batch_size": 1, "gradient_clipping": 0)", extra, "}"));
  EXPECT_THAT(loaded.status(), IsOk());
  return loaded->config;
}

v1::StepStats Stats(int server, int64_t step, std::vector<int64_t> chunks, std::vector<double> sums,
                    int64_t generation = 0, bool non_finite = false) {
  v1::StepStats s;
  s.set_job("coord");
  s.set_step(step);
  s.set_server_index(server);
  s.set_generation(generation);
  for (int64_t c : chunks) s.add_chunks(c);
  for (double x : sums) s.add_chunk_sum_squares(x);
  s.set_non_finite(non_finite);
  return s;
}

// A lead and a follower wired to each other in process; each transport
// call fails while its failure budget lasts.
struct Pair {
  Pair() : Pair(ParsedConfig()) {}
  explicit Pair(Config c) : config(std::move(c)), map(TwoServerMap()) {
    StepCoordinator::Options o;
    o.job = "coord";
    o.map = &map;
    o.config = &config;
    o.initial_backoff = absl::Milliseconds(1);
    o.server_index = 0;
    o.send_commit = [this](int server, const v1::StepCommit& commit) {
      EXPECT_EQ(server, 1);
      stalls_seen_by_commit.push_back(lead->StallDescription());  // no lock is held here
      if (commit_failures > 0) {
        --commit_failures;
        return absl::UnavailableError("the follower is away");
      }
      return follower->OnCommit(commit);
    };
    lead.emplace(o);
    o.server_index = 1;
    o.send_commit = nullptr;
    o.report_stats = [this](const v1::StepStats& s) {
      if (report_failures > 0) {
        --report_failures;
        return absl::UnavailableError("the lead is away");
      }
      return lead->OnStepStats(s);
    };
    follower.emplace(o);
  }

  // One step on both servers; the follower's round on its own thread.
  void Round(int64_t step, std::optional<v1::StepCommit>* at_lead,
             std::optional<v1::StepCommit>* at_follower, int64_t generation = 0) {
    std::thread t([&] {
      *at_follower = follower->FollowerRound(Stats(1, step, {1, 3}, {4.0, 16.0}, generation));
    });
    *at_lead = lead->LeadRound(Stats(0, step, {0, 2}, {1.0, 9.0}, generation), 1.0);
    t.join();
  }

  Config config;
  ShardMap map;
  std::atomic<int> commit_failures{0};
  std::atomic<int> report_failures{0};
  std::vector<std::string> stalls_seen_by_commit;  // the lead's thread only
  std::optional<StepCoordinator> lead;
  std::optional<StepCoordinator> follower;
};

TEST(StepCoordinatorTest, BothServersGetTheDecisionOfTheStatisticsInChunkOrder) {
  Pair p;
  std::optional<v1::StepCommit> lead, follower;
  p.Round(1, &lead, &follower);
  ASSERT_TRUE(lead.has_value());
  ASSERT_TRUE(follower.has_value());
  EXPECT_EQ(lead->SerializeAsString(), follower->SerializeAsString());
  StepDecider reference(p.config, 1);
  const StepDecision d = reference.Decide({1.0, 4.0, 9.0, 16.0}, false, 1.0);
  EXPECT_EQ(lead->step(), 1);
  EXPECT_FALSE(lead->skip());
  EXPECT_EQ(lead->grad_norm(), d.grad_norm);
  EXPECT_EQ(lead->grad_norm(), std::sqrt(30.0));
  EXPECT_EQ(lead->grad_multiplier(), d.grad_multiplier);
  EXPECT_EQ(lead->lr(), d.lr);
  EXPECT_EQ(lead->applied_steps(), 1);
  EXPECT_EQ(lead->failure(), "");
  EXPECT_EQ(p.lead->applied_steps(), 1);

  p.lead->Advance(1);
  p.follower->Advance(1);
  p.Round(2, &lead, &follower);
  ASSERT_TRUE(lead.has_value() && follower.has_value());
  EXPECT_EQ(follower->step(), 2);
  EXPECT_EQ(follower->applied_steps(), 2);
}

// Before each round both servers guess what it commits if the step is
// applied unclipped: right while it is, wrong once clipping or an overflow
// changes it; a follower does not guess again after a restore until a
// commit tells it where the steps are.
TEST(StepCoordinatorTest, TheUnclippedGuessIsTheCommitOfAnUnclippedStep) {
  Pair p;
  std::optional<v1::StepCommit> lead, follower;
  for (int64_t step = 1; step <= 3; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    const std::optional<StepInputs> at_lead = p.lead->GuessUnclipped(1.0);
    const std::optional<StepInputs> at_follower = p.follower->GuessUnclipped(1.0);
    ASSERT_TRUE(at_lead.has_value() && at_follower.has_value());
    EXPECT_EQ(*at_lead, *at_follower);
    p.Round(step, &lead, &follower);
    ASSERT_TRUE(lead.has_value() && follower.has_value());
    EXPECT_EQ(InputsOf(*lead), *at_lead);
    EXPECT_EQ(at_lead->applied_steps, step);
    p.lead->Advance(step);
    p.follower->Advance(step);
  }
  // A clipped step: the guess is not the commit.
  Config with_clipping = ParsedConfig();
  with_clipping.gradient_clipping = 1.0;  // the statistics' norm is sqrt(30)
  Pair clipped(with_clipping);
  const std::optional<StepInputs> guess = clipped.lead->GuessUnclipped(1.0);
  ASSERT_TRUE(guess.has_value());
  clipped.Round(1, &lead, &follower);
  ASSERT_TRUE(lead.has_value());
  EXPECT_LT(lead->grad_multiplier(), guess->grad_multiplier);
  EXPECT_NE(InputsOf(*lead), *guess);
  // After a restore the follower waits for a commit; the lead knows.
  p.lead->Restart(1, 4);
  p.follower->Restart(1, 4);
  EXPECT_FALSE(p.follower->GuessUnclipped(1.0).has_value());
  EXPECT_TRUE(p.lead->GuessUnclipped(1.0).has_value());
  p.Round(4, &lead, &follower, /*generation=*/1);
  ASSERT_TRUE(follower.has_value());
  EXPECT_TRUE(p.follower->GuessUnclipped(1.0).has_value());
}

// With zo.client_lr both servers guess the step once the client's rates
// reached them, and with those rates; the follower forgets them once the
// step is decided.
TEST(StepCoordinatorTest, WithClientRatesEachServerGuessesOnceTheyCame) {
  Config config = ParsedConfig();
  config.zo.client_lr = true;
  Pair p(config);
  EXPECT_FALSE(p.lead->GuessUnclipped(1.0).has_value());
  EXPECT_FALSE(p.follower->GuessUnclipped(1.0).has_value());
  for (StepCoordinator* c : {&*p.lead, &*p.follower}) {
    ASSERT_THAT(c->OnStepLr(1, 0, std::vector<double>{0.125}), IsOk());
  }
  const std::optional<StepInputs> at_lead = p.lead->GuessUnclipped(1.0);
  const std::optional<StepInputs> at_follower = p.follower->GuessUnclipped(1.0);
  ASSERT_TRUE(at_lead.has_value() && at_follower.has_value());
  EXPECT_EQ(*at_lead, *at_follower);
  EXPECT_EQ(at_lead->lr, 0.125);
  std::optional<v1::StepCommit> lead, follower;
  p.Round(1, &lead, &follower);
  ASSERT_TRUE(lead.has_value());
  EXPECT_EQ(InputsOf(*lead), *at_lead);
  p.lead->Advance(1);
  p.follower->Advance(1);
  EXPECT_FALSE(p.follower->GuessUnclipped(1.0).has_value()) << "step 2's rates have not come";
}

TEST(StepCoordinatorTest, FailedCallsAreRetriedUntilTheyGetThrough) {
  Pair p;
  p.report_failures = 3;
  p.commit_failures = 2;
  std::optional<v1::StepCommit> lead, follower;
  p.Round(1, &lead, &follower);
  ASSERT_TRUE(lead.has_value() && follower.has_value());
  EXPECT_EQ(p.report_failures, 0);
  EXPECT_EQ(p.commit_failures, 0);
  EXPECT_EQ(lead->SerializeAsString(), follower->SerializeAsString());
}

TEST(StepCoordinatorTest, APeerThatKeepsFailingIsDescribedUntilItAnswers) {
  Pair p;
  p.commit_failures = 2;
  std::optional<v1::StepCommit> lead, follower;
  p.Round(1, &lead, &follower);
  ASSERT_TRUE(lead.has_value() && follower.has_value());
  ASSERT_EQ(p.stalls_seen_by_commit.size(), 3u);
  EXPECT_EQ(p.stalls_seen_by_commit[0], "");
  EXPECT_THAT(p.stalls_seen_by_commit[1],
              ::testing::AllOf(HasSubstr("sending the step's commit failing for"),
                               HasSubstr("the follower is away")));
  EXPECT_THAT(p.stalls_seen_by_commit[2], HasSubstr("the follower is away"));
  EXPECT_EQ(p.lead->StallDescription(), "");  // it got through
}

TEST(StepCoordinatorTest, RestartAbortsALeadWaitingForStatistics) {
  Pair p;
  std::optional<v1::StepCommit> lead = v1::StepCommit();
  std::thread t([&] { lead = p.lead->LeadRound(Stats(0, 1, {0, 2}, {1.0, 9.0}), 1.0); });
  p.lead->Restart(/*generation=*/1, /*open_step=*/6);
  t.join();
  EXPECT_FALSE(lead.has_value());
  // Statistics of the old generation are dropped; the new one goes on at 6.
  ASSERT_THAT(p.lead->OnStepStats(Stats(1, 1, {1, 3}, {4.0, 16.0})), IsOk());
  p.follower->Restart(1, 6);
  std::optional<v1::StepCommit> at_follower;
  p.Round(6, &lead, &at_follower, /*generation=*/1);
  ASSERT_TRUE(lead.has_value() && at_follower.has_value());
  EXPECT_EQ(lead->generation(), 1);
  EXPECT_EQ(lead->applied_steps(), 1);
}

TEST(StepCoordinatorTest, StopAbortsAFollowerRetryingOrWaiting) {
  Pair p;
  p.report_failures = 1 << 30;  // the lead never answers
  std::optional<v1::StepCommit> follower = v1::StepCommit();
  std::thread t([&] { follower = p.follower->FollowerRound(Stats(1, 1, {1, 3}, {4.0, 16.0})); });
  p.follower->Stop();
  t.join();
  EXPECT_FALSE(follower.has_value());
}

TEST(StepCoordinatorTest, BadMessagesAreRefusedAndStaleOnesIgnored) {
  Pair p;
  EXPECT_THAT(p.follower->OnStepStats(Stats(1, 1, {1}, {1.0})),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("the lead is server 0")));
  EXPECT_THAT(p.lead->OnStepStats(Stats(2, 1, {}, {})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("server_index 2")));
  EXPECT_THAT(p.lead->OnStepStats(Stats(1, 1, {2}, {1.0})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("chunk 2 does not belong to server 1")));
  EXPECT_THAT(p.lead->OnStepStats(Stats(1, 1, {1, 3}, {1.0})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("differ in length")));
  EXPECT_THAT(p.lead->OnStepStats(Stats(1, 3, {1, 3}, {1.0, 1.0})),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("lead is at step 1")));
  EXPECT_THAT(p.lead->OnStepStats(Stats(1, 1, {1, 3}, {1.0, 1.0}, /*generation=*/7)), IsOk());

  v1::StepCommit commit;
  commit.set_step(1);
  commit.set_generation(3);
  EXPECT_THAT(p.follower->OnCommit(commit),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("generation 3")));
  commit.set_generation(0);
  commit.set_step(2);
  EXPECT_THAT(p.follower->OnCommit(commit),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("the open step is 1")));
  p.follower->Advance(2);
  EXPECT_THAT(p.follower->OnCommit(commit), IsOk());  // a retry of an applied step
}

TEST(StepCoordinatorTest, TheCommitCarriesTheJobsFailure) {
  Pair p(ParsedConfig(R"(, "zo": {"max_consecutive_skips": 1})"));
  std::thread t([&] {
    (void)p.follower->FollowerRound(
        Stats(1, 1, {1, 3}, {4.0, 16.0}, /*generation=*/0, /*non_finite=*/true));
  });
  const std::optional<v1::StepCommit> lead =
      p.lead->LeadRound(Stats(0, 1, {0, 2}, {1.0, 9.0}), 1.0);
  t.join();
  ASSERT_TRUE(lead.has_value());
  EXPECT_TRUE(lead->skip());
  EXPECT_THAT(lead->failure(), HasSubstr("job coord: 1 consecutive steps were skipped"));
}

}  // namespace
}  // namespace zo
