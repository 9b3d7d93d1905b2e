#include "server/compensation_record.h"

#include <thread>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using testing::StatusIs;

// Two tensors on this server: tensor 3 in [0, 6) of group 0, tensor 5 in
// [6, 10) of group 1.
CompensationRecord TwoParts() {
  CompensationHyperParams g0;
  g0.beta1 = 0.9;
  g0.beta2 = 0.99;
  g0.weight_decay = 0.1;
  CompensationHyperParams g1 = g0;
  g1.weight_decay = 0;
  return CompensationRecord({{.tensor = 3, .begin = 0, .length = 6, .group = 0, .hp = g0},
                             {.tensor = 5, .begin = 6, .length = 4, .group = 1, .hp = g1}});
}

CompensatedStep Step(double multiplier, double lr, int64_t applied_before,
                     std::optional<double> previous_lr) {
  CompensatedStep s;
  s.grad_multiplier = multiplier;
  s.lr = lr;
  s.applied_before = applied_before;
  s.previous_lr = previous_lr;
  return s;
}

void ExpectTerms(const CompensationTerms& got, const CompensationTerms& want) {
  EXPECT_EQ(got.tensor, want.tensor);
  EXPECT_EQ(got.elems, want.elems);
  EXPECT_DOUBLE_EQ(got.v_sum, want.v_sum);
  EXPECT_EQ(got.keep, want.keep);
  EXPECT_EQ(got.momentum, want.momentum);
  EXPECT_EQ(got.previous_keep, want.previous_keep);
  EXPECT_EQ(got.gain, want.gain);
  EXPECT_EQ(got.inv_sqrt_bias2, want.inv_sqrt_bias2);
}

TEST(CompensationRecordTest, TermsUseTheStepsDecisionAndTheVBeforeIt) {
  CompensationRecord r = TwoParts();
  const std::vector<float> v = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  // Step 4's update, in tiles of 4 that cut both parts, out of order.
  r.Decided(4, false, 0.25, 4, {1e-3, 2e-3});
  r.AddTile(8, 2, v.data() + 8);
  r.AddTile(0, 4, v.data());
  r.AddTile(4, 4, v.data() + 4);
  r.UpdateEnded(4, true, false);
  r.Decided(5, false, 0.5, 5, {3e-3, 4e-3});

  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<CompensationTerms> terms,
                          r.Await(5, absl::InfiniteFuture()));
  ASSERT_EQ(terms.size(), 2u);
  CompensationHyperParams g0;
  g0.beta1 = 0.9;
  g0.beta2 = 0.99;
  g0.weight_decay = 0.1;
  CompensationHyperParams g1 = g0;
  g1.weight_decay = 0;
  ExpectTerms(terms[0], TermsFor(g0, Step(0.5, 3e-3, 4, 1e-3), 3, 6, 1 + 2 + 3 + 4 + 5 + 6));
  ExpectTerms(terms[1], TermsFor(g1, Step(0.5, 4e-3, 4, 2e-3), 5, 4, 7 + 8 + 9 + 10));
  EXPECT_GT(terms[0].momentum, 0.0);
}

TEST(CompensationRecordTest, ASkippedStepKeepsTheVBeforeItAndBringsNoMomentum) {
  CompensationRecord r = TwoParts();
  const std::vector<float> v(10, 2.0f);
  r.Decided(1, false, 1, 1, {1e-3, 1e-3});
  r.AddTile(0, 10, v.data());
  r.UpdateEnded(1, true, false);
  r.Decided(2, true, 0, 1, {1e-3, 1e-3});
  r.UpdateEnded(2, true, true);
  r.Decided(3, false, 1, 2, {1e-3, 1e-3});  // applied: 1 and 3
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<CompensationTerms> after_skip,
                          r.Await(3, absl::InfiniteFuture()));
  EXPECT_DOUBLE_EQ(after_skip[0].v_sum, 12.0);
  EXPECT_EQ(after_skip[0].momentum, 0.0);  // step 2 moved nothing
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<CompensationTerms> skipped,
                          r.Await(2, absl::InfiniteFuture()));
  EXPECT_EQ(skipped[0].gain, 0.0);
  EXPECT_EQ(skipped[0].keep, 1.0);
}

TEST(CompensationRecordTest, AfterARestoreNothingIsKnownUntilTheNextUpdate) {
  CompensationRecord r = TwoParts();
  const std::vector<float> v(10, 1.0f);
  r.Decided(1, false, 1, 1, {1e-3, 1e-3});
  r.AddTile(0, 10, v.data());
  r.UpdateEnded(1, true, false);
  r.Forget(1);
  r.Decided(2, false, 1, 2, {1e-3, 1e-3});
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<CompensationTerms> terms,
                          r.Await(2, absl::InfiniteFuture()));
  EXPECT_EQ(terms[0].elems, 0);  // no v: the worker leaves the gradient out
  EXPECT_EQ(terms[0].momentum, 0.0);
  ZO_ASSERT_OK_AND_ASSIGN(const WeightsCompensation w, CombineTerms({&terms[0], 1}, true));
  EXPECT_EQ(w.grad, 0.0);
}

// The checkpoint keeps no decisions: a step decided before the restore is
// never decided again, so its call (waiting, or asked later) gets terms
// that leave the version as pulled instead of waiting out its deadline.
TEST(CompensationRecordTest, AStepBeforeTheRestoreIsAnsweredAsLeftAlone) {
  CompensationRecord r = TwoParts();
  const std::vector<float> v(10, 1.0f);
  for (int64_t step = 1; step <= 3; ++step) {
    r.Decided(step, false, 1, step, {1e-3, 1e-3});
    r.AddTile(0, 10, v.data());
    r.UpdateEnded(step, true, false);
  }
  absl::StatusOr<std::vector<CompensationTerms>> waited;
  std::thread waiter([&] { waited = r.Await(5, absl::InfiniteFuture()); });
  r.Forget(6);  // rolled forward past step 5 (another worker's checkpoint)
  waiter.join();
  for (const absl::StatusOr<std::vector<CompensationTerms>>& terms :
       {waited, r.Await(3, absl::InfiniteFuture())}) {
    ASSERT_TRUE(terms.ok()) << terms.status();
    for (const CompensationTerms& t : *terms) {
      ZO_ASSERT_OK_AND_ASSIGN(const WeightsCompensation w, CombineTerms({&t, 1}, true));
      EXPECT_EQ(w.last, 1.0);
      EXPECT_EQ(w.before, 0.0);
      EXPECT_EQ(w.grad, 0.0);
    }
  }
  // A step after the restore still waits for its decision.
  EXPECT_EQ(r.Await(7, absl::Now()).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(CompensationRecordTest, AnUpdateThatFailedRecordsNoV) {
  CompensationRecord r = TwoParts();
  const std::vector<float> v(10, 1.0f);
  r.Decided(1, false, 1, 1, {1e-3, 1e-3});
  r.AddTile(0, 10, v.data());
  r.UpdateEnded(1, false, false);
  r.Decided(2, false, 1, 2, {1e-3, 1e-3});
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<CompensationTerms> terms,
                          r.Await(2, absl::InfiniteFuture()));
  EXPECT_EQ(terms[1].elems, 0);
}

TEST(CompensationRecordTest, AWaitingCallGetsTheDecisionWhenItComes) {
  CompensationRecord r = TwoParts();
  absl::StatusOr<std::vector<CompensationTerms>> got;
  std::thread waiter([&] { got = r.Await(1, absl::InfiniteFuture()); });
  r.Decided(1, false, 1, 1, {1e-3, 1e-3});
  waiter.join();
  ASSERT_THAT(got.status(), testing::IsOk());
  EXPECT_EQ(got->size(), 2u);
}

TEST(CompensationRecordTest, DeadlineAndStopEndTheWait) {
  CompensationRecord r = TwoParts();
  EXPECT_EQ(r.Await(1, absl::Now()).status().code(), absl::StatusCode::kDeadlineExceeded);
  absl::StatusOr<std::vector<CompensationTerms>> got;
  std::thread waiter([&] { got = r.Await(1, absl::InfiniteFuture()); });
  r.Stop(absl::UnavailableError("the server is shutting down"));
  waiter.join();
  EXPECT_THAT(got.status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
  r.Decided(1, false, 1, 1, {1e-3, 1e-3});
  EXPECT_EQ(r.Await(1, absl::InfiniteFuture()).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace zo
