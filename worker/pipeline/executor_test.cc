#include "worker/pipeline/executor.h"

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/pipeline/in_process_transport.h"
#include "worker/pipeline/testing/toy_stage_module.h"

namespace zo::pipeline {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::zo::pipeline::testing::ToyEvent;
using ::zo::pipeline::testing::ToyStageModule;
using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

constexpr int64_t kStep = 7;

struct PipelineRun {
  std::vector<absl::StatusOr<StepTimes>> results;
  std::vector<std::unique_ptr<ToyStageModule>> modules;

  std::map<int, float> Losses() const { return modules.back()->losses(); }
  std::map<int, std::vector<float>> Grads() const {
    std::map<int, std::vector<float>> all;
    for (const auto& m : modules) all.insert(m->grads().begin(), m->grads().end());
    return all;
  }
};

// Runs every stage's program on its own thread over an InProcessFabric; a
// failing stage aborts the fabric so the others return.
PipelineRun RunInProcess(backend::Backend& backend, const std::vector<StageProgram>& programs,
                         int chunks,
                         const std::function<void(int, ToyStageModule&)>& tweak = nullptr) {
  const int stages = static_cast<int>(programs.size());
  PipelineRun run;
  for (int s = 0; s < stages; ++s) {
    run.modules.push_back(std::make_unique<ToyStageModule>(
        backend, ToyStageModule::PipelineLayers(s, stages, chunks), s == 0, s == stages - 1));
    if (tweak) tweak(s, *run.modules.back());
  }
  run.results.resize(stages, absl::UnknownError("not run"));
  InProcessFabric fabric(stages, absl::Seconds(30));
  std::vector<std::thread> threads;
  for (int s = 0; s < stages; ++s) {
    threads.emplace_back([&, s] {
      Executor executor(s, stages, chunks, programs[s], *run.modules[s], fabric.ForStage(s));
      run.results[s] = executor.RunStep(kStep);
      if (!run.results[s].ok()) fabric.Abort(run.results[s].status());
    });
  }
  for (std::thread& t : threads) t.join();
  return run;
}

// The same layers, all in one chunk of one stage.
PipelineRun RunReference(backend::Backend& backend, int virtual_stages, int micro_batches) {
  std::vector<int> all;
  for (int v = 0; v < virtual_stages; ++v) all.push_back(v);
  PipelineRun run;
  run.modules.push_back(
      std::make_unique<ToyStageModule>(backend, std::vector<std::vector<int>>{all}, true, true));
  absl::StatusOr<std::vector<StageProgram>> programs = GPipeSchedule(1, micro_batches);
  EXPECT_THAT(programs, IsOk());
  InProcessFabric fabric(1);
  Executor executor(0, 1, 1, (*programs)[0], *run.modules[0], fabric.ForStage(0));
  run.results.push_back(executor.RunStep(kStep));
  EXPECT_THAT(run.results[0], IsOk());
  return run;
}

struct ScheduleCase {
  std::string name;
  int stages;
  int micro_batches;
  int chunks;

  friend void PrintTo(const ScheduleCase& c, std::ostream* os) {
    *os << c.name << "(stages=" << c.stages << ", micro_batches=" << c.micro_batches
        << ", chunks=" << c.chunks << ")";
  }
};

class ExecutorScheduleTest : public ::testing::TestWithParam<ScheduleCase> {};

TEST_P(ExecutorScheduleTest, MatchesOneStageRunExactly) {
  const ScheduleCase& c = GetParam();
  std::unique_ptr<backend::Backend> backend = backend::MakeCpuBackend();
  absl::StatusOr<std::vector<StageProgram>> programs =
      c.name == "gpipe"  ? GPipeSchedule(c.stages, c.micro_batches)
      : c.name == "1f1b" ? OneFOneBSchedule(c.stages, c.micro_batches)
                         : InterleavedOneFOneBSchedule(c.stages, c.micro_batches, c.chunks);
  ASSERT_THAT(programs, IsOk());

  PipelineRun run = RunInProcess(*backend, *programs, c.chunks);
  for (int s = 0; s < c.stages; ++s) {
    ASSERT_THAT(run.results[s], IsOk()) << "stage " << s;
    const StepTimes& t = *run.results[s];
    EXPECT_GT(t.total_s, 0);
    EXPECT_LE(t.compute_s + t.pull_s + t.push_s + t.transfer_s, t.total_s);
  }
  PipelineRun reference = RunReference(*backend, c.stages * c.chunks, c.micro_batches);

  EXPECT_EQ(run.Losses().size(), static_cast<size_t>(c.micro_batches));
  EXPECT_EQ(run.Losses(), reference.Losses());
  EXPECT_EQ(run.Grads().size(), static_cast<size_t>(c.stages * c.chunks));
  EXPECT_EQ(run.Grads(), reference.Grads());
  // Not trivially equal: the gradients depend on every layer.
  EXPECT_NE(run.Grads().at(0), std::vector<float>(testing::kToyWidth, 0.0f));

  for (int s = 0; s < c.stages; ++s) {
    SCOPED_TRACE(::testing::Message() << "stage " << s);
    const std::vector<ToyEvent>& events = run.modules[s]->events();
    ASSERT_GE(events.size(), 2u);
    EXPECT_EQ(events.front().kind, ToyEvent::kBeginStep);
    EXPECT_EQ(events.back().kind, ToyEvent::kFinishStep);
    int begins = 0, finishes = 0;
    std::map<int, int> last_backward_index, flagged;
    std::map<int, int> flagged_index;
    for (int i = 0; i < static_cast<int>(events.size()); ++i) {
      const ToyEvent& e = events[i];
      begins += e.kind == ToyEvent::kBeginStep;
      finishes += e.kind == ToyEvent::kFinishStep;
      if (e.kind != ToyEvent::kBackward) continue;
      last_backward_index[e.chunk] = i;
      if (e.last_for_chunk) {
        ++flagged[e.chunk];
        flagged_index[e.chunk] = i;
      }
    }
    EXPECT_EQ(begins, 1);
    EXPECT_EQ(finishes, 1);
    EXPECT_EQ(last_backward_index.size(), static_cast<size_t>(c.chunks));
    for (const auto& [chunk, index] : last_backward_index) {
      EXPECT_EQ(flagged[chunk], 1) << "chunk " << chunk;
      EXPECT_EQ(flagged_index[chunk], index) << "chunk " << chunk;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, ExecutorScheduleTest,
    ::testing::Values(ScheduleCase{"gpipe", 2, 4, 1}, ScheduleCase{"gpipe", 3, 3, 1},
                      ScheduleCase{"1f1b", 2, 4, 1}, ScheduleCase{"1f1b", 3, 5, 1},
                      ScheduleCase{"interleaved", 2, 4, 2}, ScheduleCase{"interleaved", 3, 6, 2},
                      ScheduleCase{"interleaved", 1, 3, 2}),
    [](const ::testing::TestParamInfo<ScheduleCase>& info) {
      return absl::StrCat(info.param.name, "_", info.param.stages, "stages_",
                          info.param.micro_batches, "mb_", info.param.chunks, "chunks");
    });

TEST(ExecutorTest, FailingStageReturnsPrefixedErrorAndAbortFreesTheOthers) {
  std::unique_ptr<backend::Backend> backend = backend::MakeCpuBackend();
  absl::StatusOr<std::vector<StageProgram>> programs = OneFOneBSchedule(3, 4);
  ASSERT_THAT(programs, IsOk());
  PipelineRun run = RunInProcess(*backend, *programs, 1, [](int s, ToyStageModule& m) {
    if (s == 1) m.FailForwardAt(/*micro_batch=*/1, /*chunk=*/0);
  });
  // Stages 0 and 2 end with stage 1's error, not with their receive timeout
  // (DEADLINE_EXCEEDED): the abort freed them.
  EXPECT_THAT(
      run.results[1],
      StatusIs(absl::StatusCode::kInternal,
               ::testing::StartsWith("step 7, stage 1, Forward(mb=1, chunk=0): injected failure")));
  for (int s : {0, 2}) {
    EXPECT_THAT(run.results[s],
                StatusIs(absl::StatusCode::kInternal,
                         AllOf(::testing::StartsWith(absl::StrCat("step 7, stage ", s, ", ")),
                               HasSubstr("injected failure"))))
        << "stage " << s;
  }
}

// Waiting in Forward for weights still arriving (ModelStage with early
// start) is waiting for weights: the step's times move it from compute.
TEST(ExecutorTest, WeightsAwaitedInsideTheComputeCountAsWaiting) {
  std::unique_ptr<backend::Backend> backend = backend::MakeCpuBackend();
  absl::StatusOr<std::vector<StageProgram>> programs = GPipeSchedule(1, 2);
  ASSERT_THAT(programs, IsOk());
  const PipelineRun plain = RunInProcess(*backend, *programs, 1);
  const PipelineRun waited = RunInProcess(*backend, *programs, 1, [](int, ToyStageModule& m) {
    m.SayWeightsWaited(1000);  // far beyond any real time of the step
  });
  ASSERT_THAT(plain.results[0], IsOk());
  ASSERT_THAT(waited.results[0], IsOk());
  EXPECT_LT(plain.results[0]->pull_s, 100);
  EXPECT_GE(waited.results[0]->pull_s, 1000);
  EXPECT_LE(waited.results[0]->compute_s, -900);
  EXPECT_LT(waited.results[0]->total_s, 100);
}

TEST(ExecutorTest, InconsistentProgramIsInternal) {
  std::unique_ptr<backend::Backend> backend = backend::MakeCpuBackend();
  ToyStageModule module(*backend, ToyStageModule::PipelineLayers(0, 2, 1), true, false);
  InProcessFabric fabric(2, absl::Seconds(1));
  {
    Executor executor(0, 2, 1,
                      {{Op::kPullWeights}, {Op::kSendActivation, 0, 0}, {Op::kPushGradients}},
                      module, fabric.ForStage(0));
    EXPECT_THAT(
        executor.RunStep(1),
        StatusIs(absl::StatusCode::kInternal,
                 AllOf(::testing::StartsWith("step 1, stage 0, SendActivation(mb=0, chunk=0): "),
                       HasSubstr("no activation to send"))));
  }
  {  // A forward whose activation is never sent.
    Executor executor(0, 2, 1,
                      {{Op::kPullWeights},
                       {Op::kLoadMicroBatch, 0, 0},
                       {Op::kForward, 0, 0},
                       {Op::kPushGradients}},
                      module, fabric.ForStage(0));
    EXPECT_THAT(executor.RunStep(2), StatusIs(absl::StatusCode::kInternal,
                                              AllOf(HasSubstr("PushGradients"),
                                                    HasSubstr("1 activation to send(s) unused"))));
  }
  {  // A chunk the executor was not told about.
    Executor executor(0, 2, 1, {{Op::kPullWeights}, {Op::kRecvActivation, 0, 3}}, module,
                      fabric.ForStage(0));
    EXPECT_THAT(executor.RunStep(3),
                StatusIs(absl::StatusCode::kInternal, HasSubstr("chunk out of range")));
  }
}

TEST(InProcessFabricTest, HandsOverTheSameStorageInOrder) {
  std::unique_ptr<backend::Backend> backend = backend::MakeCpuBackend();
  InProcessFabric fabric(2, absl::Seconds(5));
  backend::Tensor a = backend->Zeros(DType::kFloat16, {2, 3});
  backend::Tensor b = backend->Zeros(DType::kFloat32, {4});
  const MessageTag ta{MessageTag::Kind::kActivation, 1, 0, 0};
  const MessageTag tb{MessageTag::Kind::kGrad, 1, 1, 0};
  std::thread receiver([&] {
    absl::StatusOr<backend::Tensor> got = fabric.ForStage(1).Recv(0, ta);
    ASSERT_THAT(got, IsOk());
    EXPECT_EQ(got->storage(), a.storage());
    EXPECT_EQ(got->shape(), a.shape());
    got = fabric.ForStage(1).Recv(0, tb);
    ASSERT_THAT(got, IsOk());
    EXPECT_EQ(got->storage(), b.storage());
  });
  EXPECT_THAT(fabric.ForStage(0).Send(1, ta, a), IsOk());
  EXPECT_THAT(fabric.ForStage(0).Send(1, tb, b), IsOk());
  receiver.join();
}

TEST(InProcessFabricTest, WrongTagTimeoutAndAbort) {
  std::unique_ptr<backend::Backend> backend = backend::MakeCpuBackend();
  InProcessFabric fabric(2, absl::Milliseconds(50));
  const MessageTag sent{MessageTag::Kind::kActivation, 3, 1, 0};
  const MessageTag expected{MessageTag::Kind::kActivation, 3, 2, 0};
  ASSERT_THAT(fabric.ForStage(0).Send(1, sent, backend->Zeros(DType::kFloat32, {1})), IsOk());
  EXPECT_THAT(fabric.ForStage(1).Recv(0, expected),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("expected activation(step=3, mb=2, chunk=0)"),
                             HasSubstr("received activation(step=3, mb=1, chunk=0)"))));
  EXPECT_THAT(fabric.ForStage(0).Recv(1, expected),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("from stage 1")));
  EXPECT_THAT(fabric.ForStage(0).Send(5, sent, backend->Zeros(DType::kFloat32, {1})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stage 5")));

  // The abort comes while the Recv below waits (the hook says when), so it
  // must wake a blocked receiver, not only refuse later calls.
  InProcessFabric slow(2, absl::Minutes(5));
  absl::Notification receiver_waits;
  slow.SetRecvWaitHookForTesting([&] {
    if (!receiver_waits.HasBeenNotified()) receiver_waits.Notify();
  });
  std::thread aborter([&] {
    receiver_waits.WaitForNotification();
    slow.Abort(absl::CancelledError("stage 1 gave up"));
  });
  EXPECT_THAT(slow.ForStage(0).Recv(1, expected),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("stage 1 gave up")));
  aborter.join();
  EXPECT_THAT(slow.ForStage(1).Send(0, sent, backend->Zeros(DType::kFloat32, {1})),
              StatusIs(absl::StatusCode::kCancelled, Not(HasSubstr("aborted"))));
}

}  // namespace
}  // namespace zo::pipeline
