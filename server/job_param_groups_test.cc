// Parameter groups on one server (zo.param_groups, TensorSpec::group): each
// tensor steps with its group's betas, eps and weight decay and, with
// zo.client_lr, the rate a worker sent for the step; against a double
// precision AdamW, and, with DPU, the previous version undone run by run.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/job.h"
#include "server/job_test_fixture.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using testing::IsOk;
using testing::IsOkAndHolds;
using testing::StatusIs;

// Group 0 decays; group 1 does not, with its own betas and eps.
// `zo_extra`: more keys of the zo section.
std::string TwoGroups(const std::string& zo_extra = "") {
  return absl::StrCat(
      R"("optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}},
         "zo": {"chunk_elems": 64, "client_lr": true,
                "param_groups": [{}, {"weight_decay": 0, "betas": [0.8, 0.95], "eps": 1e-6}])",
      zo_extra, "}");
}

struct GroupParams {
  double beta1, beta2, eps, weight_decay;
};
constexpr GroupParams kGroups[] = {{0.9, 0.999, 1e-8, 0.1}, {0.8, 0.95, 1e-6, 0.0}};

// Tensors of both groups, one of them across the chunk boundary at 64.
const std::vector<std::pair<int64_t, int>> kTensors = {{30, 0}, {20, 1}, {25, 0}, {25, 1}};

double RateOf(int group, int64_t step) { return group == 0 ? 0.01 * step : 0.003 / step; }
float GradientOf(int64_t step) { return 0.25f * static_cast<float>(step % 3) - 0.3f; }
float InitialWeight(int64_t i) { return 0.37f * static_cast<float>(i % 17) - 3.1f; }

// Betas, eps and weight decay a worker sends for a step (a scheduler
// cycling beta1, a loop writing weight_decay): each differs per step.
GroupParams HyperOf(int group, int64_t step) {
  const GroupParams& g = kGroups[group];
  return {.beta1 = g.beta1 - 0.02 * static_cast<double>(step),
          .beta2 = g.beta2 - 0.001 * static_cast<double>(step),
          .eps = g.eps * static_cast<double>(1 + step),
          .weight_decay = g.weight_decay + 0.01 * static_cast<double>(step)};
}

absl::Status SendRates(Job& job, int64_t step, std::vector<double> rates, int rank = 0,
                       const std::vector<GroupParams>& hyper = {}) {
  v1::StepLrRequest request;
  request.set_job("job");
  request.set_step(step);
  request.set_dp_rank(rank);
  for (double r : rates) request.add_group_lr(r);
  for (const GroupParams& g : hyper) {
    v1::GroupHyper& h = *request.add_group_hyper();
    h.set_beta1(g.beta1);
    h.set_beta2(g.beta2);
    h.set_eps(g.eps);
    h.set_weight_decay(g.weight_decay);
  }
  return job.OnStepLr(request);
}

std::vector<GroupParams> BothHyperOf(int64_t step) { return {HyperOf(0, step), HyperOf(1, step)}; }

// torch.optim.AdamW element by element, in double, over `steps` steps at
// RateOf with group g's settings at step t `settings(g, t)`, against the
// served fp32 weights.
void ExpectAdamW(const std::string& served, int64_t steps,
                 const std::function<GroupParams(int, int64_t)>& settings) {
  ASSERT_EQ(served.size(), kElems * sizeof(float));
  int64_t at = 0;
  for (const auto& [elems, group] : kTensors) {
    for (int64_t i = at; i < at + elems; ++i) {
      double p = InitialWeight(i), m = 0, v = 0;
      for (int64_t t = 1; t <= steps; ++t) {
        const GroupParams g = settings(group, t);
        const double lr = RateOf(group, t);
        const double grad = GradientOf(t);
        p *= 1 - lr * g.weight_decay;
        m = g.beta1 * m + (1 - g.beta1) * grad;
        v = g.beta2 * v + (1 - g.beta2) * grad * grad;
        const double denom = std::sqrt(v) / std::sqrt(1 - std::pow(g.beta2, t)) + g.eps;
        p -= lr / (1 - std::pow(g.beta1, t)) * m / denom;
      }
      float got = 0;
      std::memcpy(&got, served.data() + i * 4, 4);
      EXPECT_NEAR(got, p, 2e-6 * std::abs(p) + 1e-7) << "element " << i << ", group " << group;
    }
    at += elems;
  }
}

absl::Status Init(Job& job) {
  for (int64_t chunk = 0; chunk < 2; ++chunk) {
    const int64_t n = chunk == 0 ? 64 : kElems - 64;
    std::string data(static_cast<size_t>(n) * 4, '\0');
    for (int64_t i = 0; i < n; ++i) {
      const float w = InitialWeight(chunk * 64 + i);
      std::memcpy(data.data() + i * 4, &w, 4);
    }
    v1::ParamInitPiece piece;
    piece.set_job("job");
    piece.set_chunk(chunk);
    piece.set_data(std::move(data));
    ZO_RETURN_IF_ERROR(job.InitParams(piece));
  }
  return absl::OkStatus();
}

class JobParamGroupsTest : public JobTest {
 protected:
  JobParamGroupsTest() { tensors_ = kTensors; }
  void ExpectDpuUndoesGroupByGroup(bool send_hyper);
};

TEST_F(JobParamGroupsTest, EachTensorStepsWithItsGroupsConstantsAndTheWorkersRate) {
  std::unique_ptr<Job> job = Open(TwoGroups());
  ASSERT_NE(job, nullptr);
  ASSERT_THAT(Init(*job), IsOk());
  constexpr int64_t kSteps = 4;
  for (int64_t step = 1; step <= kSteps; ++step) {
    ASSERT_THAT(SendRates(*job, step, {RateOf(0, step), RateOf(1, step)}), IsOk());
    ASSERT_THAT(Push(*job, step, GradientOf(step)), IsOk());
    ASSERT_THAT(WaitForVersion(*job, step), IsOk());
  }
  EXPECT_DOUBLE_EQ(job->Status().last_lr(), RateOf(0, kSteps));
  ZO_ASSERT_OK_AND_ASSIGN(const std::string served, Weights(*job, kSteps));
  ExpectAdamW(served, kSteps, [](int group, int64_t) { return kGroups[group]; });
}

// torch.optim takes each step with the betas, eps and weight decay its
// param_groups hold then (Adam's bias corrections with that step's betas):
// so does the job, told them with the rates.
TEST_F(JobParamGroupsTest, EachStepTakesTheBetasEpsAndWeightDecayTheWorkersSent) {
  std::unique_ptr<Job> job = Open(TwoGroups());
  ASSERT_NE(job, nullptr);
  ASSERT_THAT(Init(*job), IsOk());
  constexpr int64_t kSteps = 4;
  for (int64_t step = 1; step <= kSteps; ++step) {
    // Step 3 sends none: the groups' own.
    const std::vector<GroupParams> hyper =
        step == 3 ? std::vector<GroupParams>{} : BothHyperOf(step);
    ASSERT_THAT(SendRates(*job, step, {RateOf(0, step), RateOf(1, step)}, 0, hyper), IsOk());
    ASSERT_THAT(Push(*job, step, GradientOf(step)), IsOk());
    ASSERT_THAT(WaitForVersion(*job, step), IsOk());
  }
  ZO_ASSERT_OK_AND_ASSIGN(const std::string served, Weights(*job, kSteps));
  ExpectAdamW(served, kSteps, [](int group, int64_t step) {
    return step == 3 ? kGroups[group] : HyperOf(group, step);
  });
}

TEST_F(JobParamGroupsTest, StepSettingsThatDoNotFitTheJobAreRefusedNamingWhy) {
  std::unique_ptr<Job> job = Open(TwoGroups(), v1::DTYPE_FP32, /*dp=*/2);
  ASSERT_NE(job, nullptr);
  const std::vector<double> rates = {0.01, 0.02};
  EXPECT_THAT(SendRates(*job, 1, rates, 0, {kGroups[0]}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1 groups' betas, eps and weight decay for job job, which has 2 "
                                 "parameter groups")));
  const auto with = [&](GroupParams g) { return std::vector<GroupParams>{kGroups[0], g}; };
  EXPECT_THAT(SendRates(*job, 1, rates, 0, with({1.0, 0.999, 1e-8, 0})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("beta1 of parameter group 1 is 1: must be in [0, 1)")));
  EXPECT_THAT(
      SendRates(*job, 1, rates, 0, with({0.9, -0.5, 1e-8, 0})),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("beta2 of parameter group 1")));
  EXPECT_THAT(SendRates(*job, 1, rates, 0, with({0.9, 0.999, 0, 0})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("eps of parameter group 1 is 0: must be finite and > 0")));
  EXPECT_THAT(SendRates(*job, 1, rates, 0, with({0.9, 0.999, std::nan(""), 0})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("eps of parameter group 1")));
  EXPECT_THAT(SendRates(*job, 1, rates, 0, with({0.9, 0.999, 1e-8, -0.1})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("weight_decay of parameter group 1 is -0.1")));
  ASSERT_THAT(SendRates(*job, 1, rates, 0, BothHyperOf(1)), IsOk());
  EXPECT_THAT(SendRates(*job, 1, rates, 1, BothHyperOf(2)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("dp rank 1 sent other betas, eps or weight decay for step 1")));
  EXPECT_THAT(SendRates(*job, 1, rates, 1), StatusIs(absl::StatusCode::kInvalidArgument,
                                                     HasSubstr("every rank must set the same")));
  ASSERT_THAT(SendRates(*job, 1, rates, 1, BothHyperOf(1)), IsOk());

  std::unique_ptr<Job> compensated =
      Open(TwoGroups(R"(, "dpu": {"enabled": true, "warmup_steps": 0, "compensation": "worker"})"));
  ASSERT_NE(compensated, nullptr);
  EXPECT_THAT(SendRates(*compensated, 1, rates, 0, BothHyperOf(1)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("has zo.dpu.compensation, whose terms take the job's own betas")));
  EXPECT_THAT(SendRates(*compensated, 1, rates), IsOk());
}

TEST_F(JobParamGroupsTest, RatesThatDoNotFitTheJobAreRefusedNamingWhy) {
  std::unique_ptr<Job> job = Open(TwoGroups(), v1::DTYPE_FP32, /*dp=*/2);
  ASSERT_NE(job, nullptr);
  EXPECT_THAT(SendRates(*job, 1, {0.01}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1 learning rates for job job, which has 2 parameter groups")));
  EXPECT_THAT(SendRates(*job, 1, {0.01, -1}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("learning rate of parameter group 1 is -1")));
  EXPECT_THAT(SendRates(*job, 1, {0.01, std::nan("")}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be finite")));
  EXPECT_THAT(SendRates(*job, 1, {0.01, 0.02}, /*rank=*/2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dp_rank 2")));
  EXPECT_THAT(SendRates(*job, 9, {0.01, 0.02}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("learning rates for step 9 while step 1 is open")));
  ASSERT_THAT(SendRates(*job, 1, {0.01, 0.02}), IsOk());
  ASSERT_THAT(SendRates(*job, 1, {0.01, 0.02}, /*rank=*/1), IsOk());
  EXPECT_THAT(SendRates(*job, 1, {0.01, 0.03}, /*rank=*/1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("every rank must set the same rates")));
  // The first rates hold: the step takes them.
  for (int rank = 0; rank < 2; ++rank) ASSERT_THAT(Push(*job, 1, 0.5f, rank), IsOk());
  ASSERT_THAT(WaitForVersion(*job, 1), IsOk());
  EXPECT_DOUBLE_EQ(job->Status().last_lr(), 0.01);
  EXPECT_EQ(job->Status().needs_restore(), "");
}

TEST_F(JobParamGroupsTest, RatesForAJobThatTakesItsOwnAreRefused) {
  tensors_ = {{kElems, 0}};
  std::unique_ptr<Job> job = Open(R"("zo": {"chunk_elems": 64})");
  ASSERT_NE(job, nullptr);
  EXPECT_THAT(SendRates(*job, 1, {0.01}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("zo.client_lr is false")));
}

TEST_F(JobParamGroupsTest, AGroupTheConfigDoesNotHaveIsRefusedNamingTheTensor) {
  tensors_ = {{50, 0}, {50, 2}};
  EXPECT_THAT(TryOpen(TwoGroups()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("manifest tensor \"w1\": group 2 is not one of the config's 2 "
                                 "parameter groups")));
}

// A client that never sends the rates of a step would have it taken at
// rates nobody gave: the job fails instead, saying why.
TEST_F(JobParamGroupsTest, AStepWithoutRatesFailsTheJobSayingWhy) {
  std::unique_ptr<Job> job = Open(TwoGroups());
  ASSERT_NE(job, nullptr);
  ZO_ASSERT_OK_AND_ASSIGN(const std::string initial, Weights(*job, 0));
  ASSERT_THAT(Push(*job, 1, 0.5f), IsOk());
  WaitForVersion(*job, 1).IgnoreError();
  EXPECT_THAT(job->Status().needs_restore(),
              HasSubstr("no worker sent the learning rates of step 1"));
  EXPECT_EQ(job->Status().applied_steps(), 0);
}

// With DPU the previous version is the latest undone; with groups, each
// run of elements is undone with its own group's constants, and a restore
// undoes with the rates (and the betas, eps and weight decay, where the
// workers sent them: `send_hyper`) the checkpoint recorded.
void JobParamGroupsTest::ExpectDpuUndoesGroupByGroup(bool send_hyper) {
  const auto hyper = [&](int64_t step) {
    return send_hyper ? BothHyperOf(step) : std::vector<GroupParams>{};
  };
  std::unique_ptr<Job> job =
      Open(absl::StrCat(R"("fp16": {"enabled": true}, )",
                        TwoGroups(R"(, "dpu": {"enabled": true, "warmup_steps": 0})")),
           v1::DTYPE_FP16);
  ASSERT_NE(job, nullptr);
  ASSERT_THAT(Init(*job), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(std::string served, Weights(*job, 0));
  for (int64_t step = 1; step <= 6; ++step) {
    ASSERT_THAT(SendRates(*job, step, {RateOf(0, step), RateOf(1, step)}, 0, hyper(step)), IsOk());
    ASSERT_THAT(Push(*job, step, GradientOf(step)), IsOk());
    ASSERT_THAT(WaitForVersion(*job, step), IsOk());
    ZO_ASSERT_OK_AND_ASSIGN(std::string previous, Weights(*job, step - 1));
    EXPECT_EQ(previous, served) << "version " << step - 1 << " after step " << step;
    ZO_ASSERT_OK_AND_ASSIGN(served, Weights(*job, step));
    // An undo with one group's constants for the other's elements would make
    // most of them corrections (6 bytes each).
    EXPECT_LT(job->Status().ram_bytes(), kElems * 14 + kElems / 2) << "step " << step;
  }
  ZO_ASSERT_OK_AND_ASSIGN(const std::string v5, Weights(*job, 5));
  ZO_ASSERT_OK_AND_ASSIGN(const v1::CheckpointResponse at6,
                          job->Checkpoint(6, absl::InfiniteFuture()));
  ASSERT_THAT(SendRates(*job, 7, {0.5, 0.5}, 0, hyper(7)), IsOk());
  ASSERT_THAT(Push(*job, 7, 0.1f), IsOk());
  ASSERT_THAT(WaitForVersion(*job, 7), IsOk());
  const int64_t before_restore = job->Status().ram_bytes();
  ZO_ASSERT_OK_AND_ASSIGN(const v1::RestoreResponse restored,
                          job->Restore(at6.path(), absl::InfiniteFuture(), /*rollback=*/true));
  EXPECT_EQ(restored.base_version(), 5);
  EXPECT_THAT(Weights(*job, 5), IsOkAndHolds(v5));
  EXPECT_THAT(Weights(*job, 6), IsOkAndHolds(served));
  EXPECT_LT(job->Status().ram_bytes(), before_restore + kElems / 2) << "after the restore";
  EXPECT_DOUBLE_EQ(job->Status().last_lr(), RateOf(0, 6));
}

TEST_F(JobParamGroupsTest, WithDpuThePreviousVersionIsUndoneGroupByGroup) {
  ExpectDpuUndoesGroupByGroup(/*send_hyper=*/false);
}

TEST_F(JobParamGroupsTest, WithDpuAStepsOwnBetasEpsAndWeightDecayAreUndone) {
  ExpectDpuUndoesGroupByGroup(/*send_hyper=*/true);
}

}  // namespace
}  // namespace zo
