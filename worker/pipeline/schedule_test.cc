#include "worker/pipeline/schedule.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/pipeline/simulate.h"

namespace zo::pipeline {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

constexpr int kMaxStages = 8;
constexpr int kMaxMicroBatches = 16;

// Checks, from the programs alone (not through the simulator), what every
// schedule promises: pull first and push last; each (micro-batch, chunk)
// forwarded once and backwarded once, forward first; loads and receives
// right before the compute they feed, sends right after the compute they
// come from; every send received once, by the neighbouring virtual stage.
void CheckStructure(const std::vector<StageProgram>& programs, int stages, int micro_batches,
                    int chunks) {
  ASSERT_EQ(programs.size(), static_cast<size_t>(stages));
  const int last_virtual = stages * chunks - 1;
  // (is_gradient, micro_batch, receiving virtual stage) -> count.
  std::map<std::tuple<bool, int, int>, int> sent, received;
  for (int s = 0; s < stages; ++s) {
    SCOPED_TRACE(::testing::Message() << "stage " << s);
    const StageProgram& p = programs[s];
    ASSERT_GE(p.size(), 2u);
    EXPECT_EQ(p.front().op, Op::kPullWeights);
    EXPECT_EQ(p.back().op, Op::kPushGradients);
    std::map<std::pair<int, int>, int> forward_at, backward_at;
    for (size_t i = 0; i < p.size(); ++i) {
      const Instruction& in = p[i];
      if (i > 0 && i + 1 < p.size()) {
        EXPECT_NE(in.op, Op::kPullWeights) << i;
        EXPECT_NE(in.op, Op::kPushGradients) << i;
      }
      const int v = in.chunk * stages + s;
      const std::pair<int, int> unit{in.micro_batch, in.chunk};
      auto prev_is = [&](Op op) {
        return i > 0 && p[i - 1] == Instruction{op, in.micro_batch, in.chunk};
      };
      auto next_is = [&](Op op) {
        return i + 1 < p.size() && p[i + 1] == Instruction{op, in.micro_batch, in.chunk};
      };
      switch (in.op) {
        case Op::kForward:
          ASSERT_GE(in.micro_batch, 0);
          ASSERT_LT(in.micro_batch, micro_batches);
          ASSERT_GE(in.chunk, 0);
          ASSERT_LT(in.chunk, chunks);
          EXPECT_TRUE(forward_at.emplace(unit, static_cast<int>(i)).second) << ToString(in);
          EXPECT_TRUE(prev_is(v == 0 ? Op::kLoadMicroBatch : Op::kRecvActivation)) << i;
          EXPECT_EQ(next_is(Op::kSendActivation), v != last_virtual) << i;
          break;
        case Op::kBackward:
          EXPECT_TRUE(backward_at.emplace(unit, static_cast<int>(i)).second) << ToString(in);
          EXPECT_EQ(prev_is(Op::kRecvGrad), v != last_virtual) << i;
          EXPECT_EQ(next_is(Op::kSendGrad), v != 0) << i;
          break;
        case Op::kLoadMicroBatch:
          EXPECT_EQ(v, 0) << i;
          EXPECT_TRUE(next_is(Op::kForward)) << i;
          break;
        case Op::kSendActivation:
          EXPECT_LT(v, last_virtual);
          ++sent[{false, in.micro_batch, v + 1}];
          break;
        case Op::kRecvActivation:
          ++received[{false, in.micro_batch, v}];
          break;
        case Op::kSendGrad:
          EXPECT_GT(v, 0);
          ++sent[{true, in.micro_batch, v - 1}];
          break;
        case Op::kRecvGrad:
          ++received[{true, in.micro_batch, v}];
          break;
        case Op::kPullWeights:
        case Op::kPushGradients:
          break;
      }
    }
    ASSERT_EQ(forward_at.size(), static_cast<size_t>(micro_batches * chunks));
    ASSERT_EQ(backward_at.size(), static_cast<size_t>(micro_batches * chunks));
    for (const auto& [unit, at] : forward_at) {
      ASSERT_TRUE(backward_at.contains(unit));
      EXPECT_LT(at, backward_at[unit]) << "mb " << unit.first << " chunk " << unit.second;
    }
  }
  EXPECT_EQ(sent, received);
  for (const auto& [key, count] : sent) EXPECT_EQ(count, 1);
  // Boundaries: (stages * chunks - 1) of them, each crossed once per
  // micro-batch in each direction.
  EXPECT_EQ(sent.size(), static_cast<size_t>(2 * micro_batches * last_virtual));
}

TEST(GPipeScheduleTest, AllShapesAreWellFormedAndHaveTheTextbookBubble) {
  for (int p = 1; p <= kMaxStages; ++p) {
    for (int m = 1; m <= kMaxMicroBatches; ++m) {
      SCOPED_TRACE(::testing::Message() << "stages=" << p << " micro_batches=" << m);
      ZO_ASSERT_OK_AND_ASSIGN(const std::vector<StageProgram> programs, GPipeSchedule(p, m));
      CheckStructure(programs, p, m, 1);
      ZO_ASSERT_OK_AND_ASSIGN(const SimulationResult sim, Simulate(programs));
      EXPECT_EQ(sim.makespan, 2.0 * (m + p - 1));
      EXPECT_NEAR(sim.bubble_fraction, static_cast<double>(p - 1) / (m + p - 1), 1e-12);
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(sim.peak_activations[s], m) << "stage " << s;
        EXPECT_EQ(sim.busy_time[s], 2.0 * m) << "stage " << s;
      }
    }
  }
}

TEST(OneFOneBScheduleTest, AllShapesAreWellFormedWithBoundedActivations) {
  for (int p = 1; p <= kMaxStages; ++p) {
    for (int m = 1; m <= kMaxMicroBatches; ++m) {
      SCOPED_TRACE(::testing::Message() << "stages=" << p << " micro_batches=" << m);
      ZO_ASSERT_OK_AND_ASSIGN(const std::vector<StageProgram> programs, OneFOneBSchedule(p, m));
      CheckStructure(programs, p, m, 1);
      ZO_ASSERT_OK_AND_ASSIGN(const SimulationResult sim, Simulate(programs));
      EXPECT_EQ(sim.makespan, 2.0 * (m + p - 1));
      EXPECT_NEAR(sim.bubble_fraction, static_cast<double>(p - 1) / (m + p - 1), 1e-12);
      for (int s = 0; s < p; ++s) {
        EXPECT_LE(sim.peak_activations[s], p) << "stage " << s;
        EXPECT_EQ(sim.peak_activations[s], std::min(p - s, m)) << "stage " << s;
      }
    }
  }
}

TEST(OneFOneBScheduleTest, WarmupMatchesDeepSpeed) {
  // Stage 0 of 4 with 8 micro-batches: 3 warmup forwards, then F/B pairs.
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<StageProgram> programs, OneFOneBSchedule(4, 8));
  std::vector<Op> compute;
  for (const Instruction& in : programs[0]) {
    if (in.op == Op::kForward || in.op == Op::kBackward) compute.push_back(in.op);
  }
  const Op F = Op::kForward, B = Op::kBackward;
  EXPECT_EQ(compute, (std::vector<Op>{F, F, F, F, B, F, B, F, B, F, B, F, B, B, B, B}));
}

TEST(ScheduleTest, UnequalForwardAndBackwardTimes) {
  // Both schedules idle (p - 1) * (tf + tb) per stage.
  const SimulationOptions options{.forward_time = 1.0, .backward_time = 2.0};
  for (int p = 1; p <= kMaxStages; ++p) {
    for (int m = 1; m <= kMaxMicroBatches; ++m) {
      SCOPED_TRACE(::testing::Message() << "stages=" << p << " micro_batches=" << m);
      ZO_ASSERT_OK_AND_ASSIGN(const std::vector<StageProgram> gpipe, GPipeSchedule(p, m));
      ZO_ASSERT_OK_AND_ASSIGN(const SimulationResult g, Simulate(gpipe, options));
      EXPECT_EQ(g.makespan, 3.0 * (m + p - 1));
      ZO_ASSERT_OK_AND_ASSIGN(const std::vector<StageProgram> ofob, OneFOneBSchedule(p, m));
      ZO_ASSERT_OK_AND_ASSIGN(const SimulationResult o, Simulate(ofob, options));
      EXPECT_EQ(o.makespan, 3.0 * (m + p - 1));
    }
  }
}

TEST(InterleavedScheduleTest, AllShapesAreWellFormedAndCutTheBubble) {
  for (int p = 1; p <= kMaxStages; ++p) {
    for (int v = 1; v <= 4; ++v) {
      for (int m = p; m <= kMaxMicroBatches; m += p) {
        SCOPED_TRACE(::testing::Message()
                     << "stages=" << p << " micro_batches=" << m << " chunks=" << v);
        ZO_ASSERT_OK_AND_ASSIGN(const std::vector<StageProgram> programs,
                                InterleavedOneFOneBSchedule(p, m, v));
        CheckStructure(programs, p, m, v);
        ZO_ASSERT_OK_AND_ASSIGN(const SimulationResult sim, Simulate(programs));
        // Megatron's figure: (p - 1) idle forward+backward chunk slots per
        // stage against v * m busy ones.
        EXPECT_NEAR(sim.bubble_fraction, static_cast<double>(p - 1) / (v * m + p - 1), 1e-12);
        EXPECT_EQ(sim.makespan, 2.0 * (v * m + p - 1));
      }
    }
  }
}

TEST(ScheduleTest, RejectsBadShapes) {
  EXPECT_THAT(GPipeSchedule(0, 4), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("stages must be >= 1, got 0")));
  EXPECT_THAT(OneFOneBSchedule(2, 0), StatusIs(absl::StatusCode::kInvalidArgument,
                                               HasSubstr("micro_batches must be >= 1, got 0")));
  EXPECT_THAT(OneFOneBSchedule(-1, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got -1")));
  EXPECT_THAT(InterleavedOneFOneBSchedule(0, 4, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stages")));
  EXPECT_THAT(InterleavedOneFOneBSchedule(2, 4, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("virtual_chunks")));
  EXPECT_THAT(InterleavedOneFOneBSchedule(4, 6, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("micro_batches (6)"), HasSubstr("stages (4)"))));
}

TEST(SimulateTest, ReportsDeadlockWithTheStuckStages) {
  // Stage 1 waits for a gradient before sending the activation stage... both
  // wait for each other: stage 0 receives the gradient before sending.
  const Instruction pull{Op::kPullWeights, 0, 0}, push{Op::kPushGradients, 0, 0};
  std::vector<StageProgram> programs = {
      {pull,
       {Op::kLoadMicroBatch, 0},
       {Op::kForward, 0},
       {Op::kRecvGrad, 0},
       {Op::kSendActivation, 0},
       {Op::kBackward, 0},
       push},
      {pull,
       {Op::kRecvActivation, 0},
       {Op::kForward, 0},
       {Op::kBackward, 0},
       {Op::kSendGrad, 0},
       push},
  };
  EXPECT_THAT(Simulate(programs),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("deadlock"), HasSubstr("stage 0 instruction 3 RecvGrad"),
                             HasSubstr("stage 1 instruction 1 RecvActivation"))));
  // The well-ordered version runs.
  std::swap(programs[0][3], programs[0][4]);
  EXPECT_THAT(Simulate(programs), IsOk());
}

TEST(SimulateTest, RejectsMalformedPrograms) {
  const Instruction pull{Op::kPullWeights, 0, 0}, push{Op::kPushGradients, 0, 0};
  EXPECT_THAT(Simulate({}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(">= 1")));
  EXPECT_THAT(Simulate({{pull, {Op::kBackward, 0}, push}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("without its forward")));
  EXPECT_THAT(Simulate({{pull, {Op::kForward, 0}, {Op::kForward, 0}, push}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("repeats a forward")));
  EXPECT_THAT(Simulate({{pull, {Op::kForward, 0}, {Op::kSendActivation, 0}, push}, {pull, push}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("activation of micro-batch 0 from virtual stage 0")));
  EXPECT_THAT(Simulate({{pull, {Op::kRecvActivation, 0}, push}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("below 0")));
}

}  // namespace
}  // namespace zo::pipeline
