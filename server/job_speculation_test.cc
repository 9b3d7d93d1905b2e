// The speculative update (server/job_speculation.cc) against the same job
// without it: whatever the decision does to a speculated step (keeps it,
// drops it for an overflow, updates again for clipping), the weights served
// are bit for bit the same, and the counts say which happened. The step
// hook (JobResources::speculated) orders the pushes after the speculation,
// so every step below has a chunk speculated before its last gradient.
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/tier/swap_layout.h"
#include "server/job_test_fixture.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using testing::IsOk;

// What the step hook saw: per step, the chunks speculated so far.
class SpeculationWatch {
 public:
  std::function<void(int64_t, int64_t)> Hook() {
    return [this](int64_t step, int64_t chunks) {
      std::lock_guard lock(mu_);
      chunks_[step] = chunks;
      cv_.notify_all();
    };
  }
  // Until `chunks` chunks of `step` are speculated.
  void WaitFor(int64_t step, int64_t chunks) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return chunks_[step] >= chunks; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, int64_t> chunks_;
};

class JobSpeculationTest : public JobTest {
 protected:
  // Chunk `chunk`'s gradient for `step` from one contributor: element i is
  // scale * (1 + i / 64) (fp32), or +inf with an infinite scale.
  static absl::Status PushChunk(Job& job, int64_t step, int64_t chunk, float scale, int rank,
                                int micro_batch) {
    const int64_t n = ChunkElems(chunk);
    v1::GradientPiece piece = Piece(step, chunk, rank, DType::kFloat32, micro_batch);
    std::string data(static_cast<size_t>(n) * 4, '\0');
    for (int64_t i = 0; i < n; ++i) {
      const float g = scale * (1.0f + static_cast<float>(i) / 64.0f);
      std::memcpy(data.data() + i * 4, &g, 4);
    }
    piece.set_data(std::move(data));
    return job.PushGradient(ViewOf(piece), absl::InfiniteFuture());
  }

  struct Run {
    std::string config;  // the body, without its "zo" section
    std::string zo;      // more of the "zo" section, after chunk_elems
    int dp = 1;
    int micro_batches = 1;
    // One step each: every gradient is scale * (1 + i / 64); with an
    // infinite scale chunk 1's are +inf (an overflow).
    std::vector<float> scales;
  };

  // `run` on a job with the speculative update and one without. Chunk 0
  // comes first on the speculative job, and chunk 1 only once chunk 0 is
  // speculated (the step then goes ahead at once, so exactly one chunk of
  // each step is speculated), except after a clipped step (a scale of 0.5
  // or more, with gradient_clipping 1.0), which the job does not speculate
  // on. The weights served after every step must be the same bits. Returns
  // the speculative job's status at the end.
  v1::JobStatus RunBoth(const Run& run) {
    const std::string zo = absl::StrCat(
        R"("zo": {"chunk_elems": 64)",
        run.micro_batches > 1 ? R"(, "gradient_accumulation": "servers")" : "", run.zo);
    SpeculationWatch watch;
    speculated_ = watch.Hook();
    absl::StatusOr<std::unique_ptr<Job>> speculative =
        TryOpen(absl::StrCat(run.config, ", ", zo, "}"), v1::DTYPE_FP32, run.dp, run.micro_batches);
    speculated_ = nullptr;
    absl::StatusOr<std::unique_ptr<Job>> plain =
        TryOpen(absl::StrCat(run.config, ", ", zo, R"(, "speculative_update": false})"),
                v1::DTYPE_FP32, run.dp, run.micro_batches);
    EXPECT_THAT(speculative.status(), IsOk());
    EXPECT_THAT(plain.status(), IsOk());
    if (!speculative.ok() || !plain.ok()) return {};
    EXPECT_EQ((*speculative)->Status().no_speculation(), "");
    EXPECT_EQ((*plain)->Status().no_speculation(), "zo.speculative_update is false");
    const std::vector<float> initial(kElems, 0.5f);
    for (Job* job : {speculative->get(), plain->get()}) {
      for (int64_t chunk = 0; chunk < 2; ++chunk) {
        v1::ParamInitPiece init;
        init.set_job("job");
        init.set_chunk(chunk);
        init.set_data(std::string(reinterpret_cast<const char*>(initial.data()),
                                  static_cast<size_t>(ChunkElems(chunk)) * 4));
        EXPECT_THAT(job->InitParams(init), IsOk());
      }
    }
    const auto push_all = [&](Job& job, int64_t step, int64_t chunk, float scale) {
      for (int rank = 0; rank < run.dp; ++rank) {
        for (int mb = 0; mb < run.micro_batches; ++mb) {
          ASSERT_THAT(PushChunk(job, step, chunk, scale, rank, mb), IsOk());
        }
      }
    };
    const bool clips = run.config.find("gradient_clipping") != std::string::npos;
    bool after_clipped = false;
    for (size_t k = 0; k < run.scales.size(); ++k) {
      const int64_t step = static_cast<int64_t>(k) + 1;
      SCOPED_TRACE(::testing::Message() << "step " << step << " scale " << run.scales[k]);
      const float last = run.scales[k];
      const float first = std::isinf(last) ? 1e-3f : last;
      // An in-process pull of the step's version waits from the start, as
      // a worker's prefetch does: the speculation writes it ahead.
      std::string area(kElems * 4, '\xff');
      v1::PullParamsRequest request;
      request.set_job("job");
      request.set_version(step);
      request.set_have_version(-1);
      const absl::StatusOr<PullFills::Id> id =
          (*speculative)
              ->RegisterPullInto(
                  request, absl::MakeSpan(reinterpret_cast<std::byte*>(area.data()), area.size()));
      EXPECT_THAT(id.status(), IsOk());
      if (!id.ok()) return {};
      EXPECT_NE(*id, 0u);
      push_all(**speculative, step, 0, first);
      if (!after_clipped) watch.WaitFor(step, 1);
      after_clipped = clips && !std::isinf(last) && std::abs(last) >= 0.5f;
      push_all(**speculative, step, 1, last);
      push_all(**plain, step, 0, first);
      push_all(**plain, step, 1, last);
      absl::StatusOr<std::string> want = Weights(**plain, step);
      absl::StatusOr<std::string> got = Weights(**speculative, step);
      EXPECT_THAT(want.status(), IsOk());
      EXPECT_THAT(got.status(), IsOk());
      if (!want.ok() || !got.ok()) return {};
      EXPECT_TRUE(*got == *want) << "the weights differ";
      // Filled by every update that makes the version (not a skipped step).
      absl::StatusOr<std::optional<InProcessRoute::PullResult>> taken =
          (*speculative)->TakeFilledPull(step, *id);
      EXPECT_THAT(taken.status(), IsOk());
      if (taken.ok() && taken->has_value()) {
        ++filled_pulls_;
        EXPECT_TRUE(area == *want) << "the weights the update wrote into the pull differ";
      }
      EXPECT_FALSE(*got == std::string(reinterpret_cast<const char*>(initial.data()), kElems * 4))
          << "the weights never moved";
    }
    return (*speculative)->Status();
  }

  int filled_pulls_ = 0;  // RunBoth's pulls that the update wrote
};

// One server, one rank: kept, dropped for an overflow, updated again when
// clipping sets in (the step after a clipped one is not speculated on),
// and kept again when it lets go.
TEST_F(JobSpeculationTest, EveryDecisionLeavesTheWeightsOfTheUpdateWithoutIt) {
  const float inf = std::numeric_limits<float>::infinity();
  const v1::JobStatus st =
      RunBoth({.config = R"("gradient_clipping": 1.0)",
               .zo = "",
               .dp = 1,
               .micro_batches = 1,
               .scales = {1e-3f, inf, 1.0f, 2e-3f, 0.5f, -1e-3f, inf, 1e-3f, 2e-3f}});
  // Steps 4 and 6 come after clipped ones.
  EXPECT_EQ(st.speculated_chunks(), 7);
  EXPECT_EQ(st.confirmed_chunks(), 3);
  EXPECT_EQ(filled_pulls_, 7) << "every step but the two skipped";
  EXPECT_EQ(st.redone_chunks(), 4);
  EXPECT_GT(st.redo_seconds(), 0.0);
}

// Two dp ranks summed in fp32, and micro-batches summed on the server: the
// chunk fills only with every contributor's gradient.
TEST_F(JobSpeculationTest, DpRanksAndMicroBatchesSumBeforeTheChunkIsSpeculated) {
  const v1::JobStatus st = RunBoth({.config = R"("gradient_clipping": 1.0)",
                                    .zo = "",
                                    .dp = 2,
                                    .micro_batches = 2,
                                    .scales = {1e-3f, 0.5f, 2e-3f, 3e-3f}});
  EXPECT_EQ(st.speculated_chunks(), 3);
  EXPECT_EQ(st.confirmed_chunks(), 2);
  EXPECT_EQ(st.redone_chunks(), 1);
}

// fp16-style loss scaling with a schedule: the guess carries the step's
// scale and rate; AdamW decay too.
TEST_F(JobSpeculationTest, TheScheduleAndWeightDecayAreGuessedRight) {
  const v1::JobStatus st = RunBoth(
      {.config = R"("optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}},
                   "scheduler": {"type": "WarmupLR",
                                 "params": {"warmup_num_steps": 3, "warmup_min_lr": 0.001}})",
       .zo = "",
       .dp = 1,
       .micro_batches = 1,
       .scales = {1e-3f, 2e-3f, 3e-3f, 4e-3f}});
  EXPECT_EQ(st.confirmed_chunks(), 4);
  EXPECT_EQ(st.redone_chunks(), 0);
}

// The chunks left when a speculated step is decided go first layers
// first, and a pull of the first layers' tensors is answered once they are
// written, before the version is whole: the next forward starts on them
// while the servers still write the last layers.
TEST_F(JobSpeculationTest, APullOfTheFirstLayersIsAnsweredBeforeTheVersionIsWhole) {
  tensors_ = {{64, 0}, {kElems - 64, 0}};  // a chunk each
  SpeculationWatch watch;
  speculated_ = watch.Hook();
  std::mutex mu;
  std::condition_variable cv;
  bool committing = false, go_on = false;
  committing_ = [&](int64_t) {
    std::unique_lock lock(mu);
    committing = true;
    cv.notify_all();
    cv.wait(lock, [&] { return go_on; });
  };
  std::unique_ptr<Job> job = Open(R"("gradient_clipping": 0)");
  speculated_ = nullptr;
  committing_ = nullptr;
  std::unique_ptr<Job> plain =
      Open(R"("gradient_clipping": 0, "zo": {"chunk_elems": 64, "speculative_update": false})");
  ASSERT_NE(job, nullptr);
  ASSERT_NE(plain, nullptr);
  absl::Cleanup release = [&] {
    std::lock_guard lock(mu);
    go_on = true;
    cv.notify_all();
  };
  ASSERT_THAT(PushChunk(*plain, 1, 0, 0.25f, 0, 0), IsOk());
  ASSERT_THAT(PushChunk(*plain, 1, 1, 0.5f, 0, 0), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const std::string want, Weights(*plain, 1));

  std::string area(kElems * 4, '\xff');
  v1::PullParamsRequest request;
  request.set_job("job");
  request.set_version(1);
  request.set_have_version(-1);
  request.add_tensors(0);
  ZO_ASSERT_OK_AND_ASSIGN(
      const PullFills::Id id,
      job->RegisterPullInto(
          request, absl::MakeSpan(reinterpret_cast<std::byte*>(area.data()), area.size())));
  ASSERT_NE(id, 0u);
  // The backward: the last layer's gradient first.
  ASSERT_THAT(PushChunk(*job, 1, 1, 0.5f, 0, 0), IsOk());
  watch.WaitFor(1, 1);
  ASSERT_THAT(PushChunk(*job, 1, 0, 0.25f, 0, 0), IsOk());
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return committing; });
  }
  ZO_ASSERT_OK_AND_ASSIGN(const std::optional<InProcessRoute::PullResult> taken,
                          job->TakeFilledPull(1, id));
  ASSERT_TRUE(taken.has_value()) << "the first layer's weights are written: the pull is answered";
  EXPECT_EQ(taken->bytes, 64 * 4);
  EXPECT_TRUE(area.compare(0, 64 * 4, want, 0, 64 * 4) == 0) << "the weights differ";
  EXPECT_EQ(area.substr(64 * 4), std::string((kElems - 64) * 4, '\xff'));
  EXPECT_EQ(job->Status().version(), 0) << "the version is not whole yet";
  std::move(release).Invoke();
  ZO_ASSERT_OK_AND_ASSIGN(const std::string got, Weights(*job, 1));
  EXPECT_TRUE(got == want) << "the weights differ";
  EXPECT_EQ(job->Status().confirmed_chunks(), 1);
}

// A restore while a step is speculated on: the step the speculation
// belonged to is undone, and the same step taken again after the restore
// with other gradients gets the weights the job without speculation gets.
TEST_F(JobSpeculationTest, ARestoreDropsTheSpeculationOfTheStepItUndoes) {
  SpeculationWatch watch;
  speculated_ = watch.Hook();
  std::unique_ptr<Job> job = Open(R"("gradient_clipping": 0)");
  speculated_ = nullptr;
  std::unique_ptr<Job> plain =
      Open(R"("gradient_clipping": 0, "zo": {"chunk_elems": 64, "speculative_update": false})");
  ASSERT_NE(job, nullptr);
  ASSERT_NE(plain, nullptr);
  for (Job* j : {job.get(), plain.get()}) {
    ASSERT_THAT(PushChunk(*j, 1, 0, 0.5f, 0, 0), IsOk());
    ASSERT_THAT(PushChunk(*j, 1, 1, 0.5f, 0, 0), IsOk());
  }
  ASSERT_THAT(WaitForVersion(*job, 1), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const v1::CheckpointResponse at1,
                          job->Checkpoint(1, absl::InfiniteFuture()));
  ASSERT_THAT(PushChunk(*job, 2, 0, 3.0f, 0, 0), IsOk());
  watch.WaitFor(2, 1);
  ZO_ASSERT_OK_AND_ASSIGN(const v1::RestoreResponse restored,
                          job->Restore(at1.path(), absl::InfiniteFuture(), /*rollback=*/true));
  ASSERT_EQ(restored.version(), 1);
  for (Job* j : {job.get(), plain.get()}) {
    ASSERT_THAT(PushChunk(*j, 2, 0, -0.25f, 0, 0), IsOk());
    ASSERT_THAT(PushChunk(*j, 2, 1, -0.25f, 0, 0), IsOk());
  }
  ZO_ASSERT_OK_AND_ASSIGN(const std::string got, Weights(*job, 2));
  ZO_ASSERT_OK_AND_ASSIGN(const std::string want, Weights(*plain, 2));
  EXPECT_TRUE(got == want) << "the weights differ";
  EXPECT_EQ(job->Status().confirmed_chunks() + job->Status().redone_chunks(),
            job->Status().speculated_chunks() - 1)
      << "the chunk the restore dropped is neither kept nor redone";
}

// A checkpoint asked for at version 1 and taken while steps 2 and 3 are
// speculated and kept holds the version it names (the commit shows it each
// tile as it was): restored, it serves that version again and replays to
// step 3's bits. The asking thread may start late, so the version it names
// is any of 1 to 3.
TEST_F(JobSpeculationTest, ACheckpointTakenWhileStepsAreSpeculatedHoldsItsVersion) {
  SpeculationWatch watch;
  speculated_ = watch.Hook();
  std::unique_ptr<Job> job = Open(R"("gradient_clipping": 0)");
  speculated_ = nullptr;
  ASSERT_NE(job, nullptr);
  std::map<int64_t, std::string> weights;
  const auto step = [&](int64_t s) {
    ASSERT_THAT(PushChunk(*job, s, 0, 0.25f * static_cast<float>(s), 0, 0), IsOk());
    watch.WaitFor(s, 1);
    ASSERT_THAT(PushChunk(*job, s, 1, 0.25f * static_cast<float>(s), 0, 0), IsOk());
    ZO_ASSERT_OK_AND_ASSIGN(weights[s], Weights(*job, s));
  };
  step(1);
  absl::StatusOr<v1::CheckpointResponse> ckpt;
  std::thread asker([&] { ckpt = job->Checkpoint(1, absl::InfiniteFuture()); });
  for (int64_t s = 2; s <= 3; ++s) step(s);
  asker.join();
  ASSERT_THAT(ckpt.status(), IsOk());
  const int64_t version = ckpt->version();
  ASSERT_GE(version, 1);
  ASSERT_LE(version, 3);
  EXPECT_GE(job->Status().confirmed_chunks(), 3);
  ZO_ASSERT_OK_AND_ASSIGN(const v1::RestoreResponse restored,
                          job->Restore(ckpt->path(), absl::InfiniteFuture(), /*rollback=*/true));
  ASSERT_EQ(restored.version(), version);
  ZO_ASSERT_OK_AND_ASSIGN(const std::string again, Weights(*job, version));
  EXPECT_TRUE(again == weights[version]);
  for (int64_t s = version + 1; s <= 3; ++s) {
    ASSERT_THAT(PushChunk(*job, s, 0, 0.25f * static_cast<float>(s), 0, 0), IsOk());
    ASSERT_THAT(PushChunk(*job, s, 1, 0.25f * static_cast<float>(s), 0, 0), IsOk());
  }
  ZO_ASSERT_OK_AND_ASSIGN(const std::string again3, Weights(*job, 3));
  EXPECT_TRUE(again3 == weights[3]) << "m and v of version 1 are not what the checkpoint holds";
}

// Where it cannot be exact or would not help, a job does not speculate and
// says why.
TEST_F(JobSpeculationTest, SaysWhyItDoesNotSpeculate) {
  auto dpu = Open(R"("zo": {"chunk_elems": 64, "dpu": {"enabled": true}})");
  ASSERT_NE(dpu, nullptr);
  EXPECT_THAT(dpu->Status().no_speculation(), HasSubstr("zo.dpu"));
  ram_budget_bytes_ = kElems * 12;  // the state, not a second copy
  auto tight = Open("");
  ASSERT_NE(tight, nullptr);
  EXPECT_THAT(tight->Status().no_speculation(),
              HasSubstr("memory budget (1.17 KiB) holds the optimizer state"));
  ram_budget_bytes_ = -1;
  // The state, fp32 gradients and a checkpoint's staging fit, and half a
  // second copy of the state.
  available_ram_ = [] {
    return std::optional<int64_t>(kElems * 16 + 3 * kTileElems * 4 + kElems * 6);
  };
  auto small_host = Open("");
  ASSERT_NE(small_host, nullptr);
  EXPECT_THAT(small_host->Status().no_speculation(),
              HasSubstr("a second copy of the optimizer state takes"));
  // The state and the gradients fit; a second copy would not: the job
  // opens without it rather than failing.
  EXPECT_EQ(small_host->Status().ram_bytes(), kElems * (12 + 4));
}

}  // namespace
}  // namespace zo
