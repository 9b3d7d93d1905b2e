// JobPosition on its own: pulls that wait for a version and wake when it
// comes, is written, fails or is restored away; the step thread's work, an
// update's end in each way it can end, and a restore between a step's
// decision and its end; the fills' registration against the update; a stop.
// The whole job's side is server/job_test.cc.
#include "server/job_position.h"

#include <atomic>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/error_detail.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

class JobPositionTest : public ::testing::Test {
 protected:
  // A wait for `version` that records when its wake ran.
  struct Waiter {
    std::shared_ptr<absl::Notification> woken = std::make_shared<absl::Notification>();
    WaitList::Ticket ticket = WaitList::kNone;
    absl::StatusOr<bool> has;
  };
  Waiter Await(int64_t version, bool while_written = false) {
    Waiter w;
    w.has = position_.AwaitVersion(
        version, [n = w.woken] { n->Notify(); }, &w.ticket, while_written);
    return w;
  }
  // Everything posted so far has run.
  bool Woken(const Waiter& w) {
    wakes_.Drain();
    return w.woken->HasBeenNotified();
  }

  // Ends an update of `step` decided in `generation`: what the hooks saw.
  struct Ended {
    std::optional<absl::Duration> wait;
    std::optional<bool> fills_made;
    std::optional<int64_t> advanced;
  };
  Ended End(int64_t step, int64_t generation, absl::Status applied = absl::OkStatus(),
            const std::string& failure = "") {
    v1::StepCommit commit;
    commit.set_step(step);
    commit.set_next_loss_scale(1024.0 * step);
    commit.set_failure(failure);
    Ended e;
    const absl::Time now = absl::Now();
    e.wait = position_.EndUpdate({.commit = &commit,
                                  .generation = generation,
                                  .applied = std::move(applied),
                                  .ready = now,
                                  .update_end = now},
                                 {.fills_end = [&](bool made) { e.fills_made = made; },
                                  .advanced = [&](int64_t s) { e.advanced = s; }});
    return e;
  }

  CheckpointMeta MetaAt(int64_t version) const {
    CheckpointMeta meta;
    meta.version = version;
    meta.applied_steps = version;
    meta.loss_scale = 8.0;
    return meta;
  }

  WakeQueue wakes_;
  std::vector<absl::Status> health_changes_;
  JobPosition position_{
      {.job = "j",
       .lead = "lead:1",
       .initial_loss_scale = 65536.0,
       .wakes = &wakes_,
       .on_health = [this](const absl::Status& h) { health_changes_.push_back(h); }}};
};

TEST_F(JobPositionTest, APullWaitsForItsVersionAndWakesWhenTheUpdateMakesIt) {
  Waiter w = Await(1);
  ASSERT_THAT(w.has.status(), IsOk());
  EXPECT_FALSE(*w.has);
  EXPECT_FALSE(Woken(w));
  v1::JobStatus status;
  position_.AddTo(status);
  EXPECT_EQ(status.waiting_pulls(), 1);

  ASSERT_TRUE(position_.BeginApplying(0));
  const Ended e = End(1, 0);
  ASSERT_TRUE(e.wait.has_value());
  EXPECT_EQ(e.advanced, 1);
  EXPECT_EQ(e.fills_made, true);
  EXPECT_TRUE(Woken(w));
  EXPECT_EQ(position_.version(), 1);
  EXPECT_EQ(position_.ScaleFor(1), 1024.0);  // the commit's next scale
  EXPECT_EQ(position_.ScaleFor(0), 65536.0);
  // A version the job has is answered at once, and keeps no wake.
  Waiter again = Await(1);
  EXPECT_EQ(again.has.value_or(false), true);
  EXPECT_EQ(again.ticket, WaitList::kNone);
  EXPECT_FALSE(position_.CancelVersionWait(w.ticket));  // already taken
}

TEST_F(JobPositionTest, AVersionBeingWrittenWakesOnlyThePullsThatFollowTheUpdate) {
  Waiter w = Await(1);
  int hooks = 0;
  position_.BeginWriting(1, 512.0, [&] { ++hooks; });
  EXPECT_EQ(hooks, 1);
  EXPECT_TRUE(Woken(w));  // it asks again and finds the version not yet the job's
  EXPECT_EQ(Await(1, /*while_written=*/true).has.value_or(false), true);
  Waiter plain = Await(1);
  EXPECT_EQ(plain.has.value_or(true), false);
  // A cursor may open on it while written; the loss scale is the new one.
  absl::StatusOr<JobPosition::Opening> opening = position_.OpenPull(1, true);
  ASSERT_THAT(opening.status(), IsOk());
  EXPECT_EQ(opening->loss_scale, 512.0);
  EXPECT_THAT(position_.OpenPull(1, false).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("does not exist yet")));

  End(1, 0);
  EXPECT_TRUE(Woken(plain));
  EXPECT_THAT(position_.AwaitWritten(1), IsOk());
}

TEST_F(JobPositionTest, AFailedUpdateNeedsARestoreAndTellsTheWaitingPulls) {
  Waiter w = Await(1);
  position_.BeginWriting(1, 512.0, [] {});
  Waiter later = Await(2);
  const Ended e = End(1, 0, absl::DataLossError("NVMe read failed"));
  EXPECT_FALSE(e.wait.has_value());
  EXPECT_EQ(e.fills_made, false);
  EXPECT_FALSE(e.advanced.has_value());
  EXPECT_EQ(position_.version(), 0);
  EXPECT_TRUE(Woken(later));
  ASSERT_EQ(health_changes_.size(), 1u);
  EXPECT_EQ(ReasonOf(health_changes_[0]), v1::ErrorDetail::NEEDS_RESTORE);
  EXPECT_THAT(position_.AwaitWritten(1), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                  HasSubstr("the update did not end it")));
  const absl::StatusOr<bool> asked = position_.AwaitVersion(
      2, [] {}, &w.ticket, false);
  EXPECT_THAT(asked.status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("NVMe read failed")));
  EXPECT_EQ(w.ticket, WaitList::kNone);
}

TEST_F(JobPositionTest, ACommitThatCarriesAFailureIsTheVersionButStopsTheSteps) {
  const Ended e = End(1, 0, absl::OkStatus(), "the loss scale fell below min_loss_scale");
  ASSERT_TRUE(e.wait.has_value());
  EXPECT_EQ(position_.version(), 1);
  EXPECT_THAT(position_.health(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("below min_loss_scale")));
  EXPECT_THAT(position_.CheckAt(1), StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
}

TEST_F(JobPositionTest, ARestoreBetweenTheDecisionAndTheEndDropsTheStep) {
  // The restore came before the step's decision: it is not applied at all.
  position_.BeginRestore(1);
  EXPECT_FALSE(position_.BeginApplying(0));
  position_.EndRestore(MetaAt(0), {}, 0, absl::OkStatus(), "/ckpt/0", true);

  // The restore came while the update ran: the update's end changes nothing.
  ASSERT_TRUE(position_.BeginApplying(1));
  position_.BeginRestore(2);
  const Ended e = End(1, 1);
  EXPECT_FALSE(e.wait.has_value());
  EXPECT_FALSE(e.advanced.has_value());
  EXPECT_EQ(e.fills_made, false);
  EXPECT_EQ(position_.version(), 0);
  EXPECT_TRUE(position_.RestoredSince(0));
  EXPECT_THAT(position_.OpenPull(0, false).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("was being restored")));
}

TEST_F(JobPositionTest, ARestoreMovesTheJobAndWakesEveryWaitingPull) {
  for (int step = 1; step <= 3; ++step) End(step, 0);
  Waiter w = Await(4);
  position_.BeginRestore(7);
  EXPECT_TRUE(Woken(w));  // to ask again, and wait for the restore's end
  Waiter during = Await(1);
  EXPECT_EQ(during.has.value_or(true), false);  // even for a version the job had
  EXPECT_FALSE(Woken(during));
  position_.EndRestore(MetaAt(2), {.lr = 0.1}, /*oldest_version=*/1, absl::OkStatus(), "/ckpt/2",
                       true);
  EXPECT_TRUE(Woken(during));
  EXPECT_EQ(position_.version(), 2);
  EXPECT_EQ(position_.base_version(), 2);
  const JobPosition::Restorable r = position_.restorable();
  EXPECT_EQ(r.oldest_version, 1);
  EXPECT_EQ(r.generation, 7);
  EXPECT_EQ(position_.ScaleFor(2), 8.0);  // the checkpoint's scale
  EXPECT_THAT(position_.AwaitCheckpointVersion(6, 2, absl::InfinitePast()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("generation 6")));
  EXPECT_THAT(position_.AwaitCheckpointVersion(7, 2, absl::InfinitePast()), IsOk());
  EXPECT_THAT(position_.AwaitCheckpointVersion(7, 1, absl::InfinitePast()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("at version 2")));
  EXPECT_THAT(position_.AwaitCheckpointVersion(7, 3, absl::InfinitePast()),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
}

TEST_F(JobPositionTest, ACheckpointOfTheNextVersionWaitsForItsStep) {
  std::atomic<bool> reached = false;
  absl::Status waited;
  std::thread checkpoint([&] {
    waited = position_.AwaitCheckpointVersion(0, 1, absl::InfiniteFuture());
    reached = true;
  });
  EXPECT_FALSE(reached);
  End(1, 0);
  checkpoint.join();
  EXPECT_THAT(waited, IsOk());
}

TEST_F(JobPositionTest, TheStepThreadWaitsForWorkAndACheckpointGoesFirst) {
  std::atomic<bool> ready = false;
  std::atomic<bool> checkpoint = false;
  std::atomic<bool> speculation = false;
  const JobPosition::WorkTests tests{
      .checkpoint_due = [&](int64_t, bool) { return checkpoint.load(); },
      .step_ready = [&] { return ready.load(); },
      .speculation_ready = [&] { return speculation.load(); },
      .idle = nullptr,
  };
  std::optional<JobPosition::Work> work;
  std::thread speculating([&] { work = position_.AwaitWork(tests); });
  speculation = true;
  position_.Notify();
  speculating.join();
  ASSERT_TRUE(work.has_value());
  EXPECT_EQ(work->kind, JobPosition::Work::Kind::kSpeculate);
  // The step goes before a speculation.
  speculation = false;
  std::thread step_thread([&] { work = position_.AwaitWork(tests); });
  ready = true;
  speculation = true;
  position_.Notify();
  step_thread.join();
  ASSERT_TRUE(work.has_value());
  EXPECT_EQ(work->kind, JobPosition::Work::Kind::kStep);
  EXPECT_EQ(work->version, 0);

  checkpoint = true;
  EXPECT_EQ(position_.AwaitWork(tests).kind, JobPosition::Work::Kind::kCheckpoint);
  // Unhealthy, no step is due, and a checkpoint runs to fail its requests.
  checkpoint = false;
  End(1, 0, absl::InternalError("disk"));
  std::thread stopper([&] { (void)position_.Stop(absl::CancelledError("bye")); });
  EXPECT_EQ(position_.AwaitWork(tests).kind, JobPosition::Work::Kind::kStop);
  stopper.join();
}

TEST_F(JobPositionTest, AnAttachWaitsForTheDecidedStepToBeApplied) {
  ASSERT_TRUE(position_.BeginApplying(0));
  std::atomic<bool> attached = false;
  std::thread attach([&] {
    position_.AwaitNotApplying(absl::Hours(1));
    attached = true;
  });
  End(1, 0);
  EXPECT_FALSE(attached);  // the update ended, but the step thread has not moved on
  const JobPosition::WorkTests step_at_once{.checkpoint_due = nullptr,
                                            .step_ready = [] { return true; },
                                            .speculation_ready = nullptr,
                                            .idle = nullptr};
  EXPECT_EQ(position_.AwaitWork(step_at_once).kind, JobPosition::Work::Kind::kStep);
  attach.join();
  EXPECT_TRUE(attached);
}

// The next version and the one after register before their updates (a
// worker answered range by range pulls the one after while the next is
// written), the version being written during it, and none after it.
TEST_F(JobPositionTest, AFillRegistersBeforeOrDuringItsUpdateAndNeverAfter) {
  const auto before = [] { return uint64_t{1}; };
  const auto during = [] { return uint64_t{2}; };
  EXPECT_TRUE(position_.MayFill(1));
  EXPECT_TRUE(position_.MayFill(2));
  EXPECT_FALSE(position_.MayFill(3));
  EXPECT_EQ(position_.RegisterFill(1, before, during), 1u);
  EXPECT_EQ(position_.RegisterFill(2, before, during), 1u);
  EXPECT_EQ(position_.RegisterFill(3, before, during), 0u);
  position_.BeginWriting(1, 1.0, [] {});
  EXPECT_EQ(position_.RegisterFill(1, before, during), 2u);
  EXPECT_EQ(position_.RegisterFill(2, before, during), 1u);
  EXPECT_EQ(position_.RegisterFill(3, before, during), 0u);
  End(1, 0);
  EXPECT_EQ(position_.RegisterFill(1, before, during), 0u);
  EXPECT_EQ(position_.RegisterFill(2, before, during), 1u);
  EXPECT_EQ(position_.RegisterFill(3, before, during), 1u);
  position_.BeginRestore(1);
  EXPECT_FALSE(position_.MayFill(2));
  EXPECT_EQ(position_.RegisterFill(2, before, during), 0u);
}

TEST_F(JobPositionTest, AStopEndsEveryWaitWithTheFirstReasonAndHealthNoLongerReaches) {
  Waiter w = Await(1);
  EXPECT_THAT(position_.Stop(absl::UnavailableError("shutting down")),
              StatusIs(absl::StatusCode::kUnavailable, "shutting down"));
  EXPECT_THAT(position_.Stop(absl::CancelledError("again")),
              StatusIs(absl::StatusCode::kUnavailable, "shutting down"));
  EXPECT_TRUE(Woken(w));
  WaitList::Ticket ticket;
  EXPECT_THAT(position_
                  .AwaitVersion(
                      1, [] {}, &ticket, false)
                  .status(),
              StatusIs(absl::StatusCode::kUnavailable, "shutting down"));
  EXPECT_TRUE(position_.gave_up());
  EXPECT_FALSE(position_.MayFill(1));
  EXPECT_FALSE(position_.BeginApplying(0));
  position_.LeadRestoreEnded(absl::InternalError("late"), "/ckpt");
  End(1, 0, absl::InternalError("late"));
  EXPECT_TRUE(health_changes_.empty());
  EXPECT_FALSE(position_.MarkLost("gone"));
}

TEST_F(JobPositionTest, InitialWeightsAndTheLeadsLossAreOnlyForAJobThatHasNotStepped) {
  EXPECT_THAT(position_.CheckUnstepped(), IsOk());
  // Before the first step the lead may not have opened its part: no loss.
  position_.LeadLost(absl::NotFoundError("no job j"));
  EXPECT_THAT(position_.health(), IsOk());
  End(1, 0);
  EXPECT_THAT(position_.CheckUnstepped(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("only at version 0")));
  position_.LeadLost(absl::NotFoundError("no job j"));
  EXPECT_FALSE(position_.health().ok());
  position_.LeadAnswered();
  EXPECT_THAT(position_.health(), IsOk());
  ASSERT_EQ(health_changes_.size(), 2u);
  EXPECT_THAT(health_changes_[1], IsOk());  // the accumulator reopens
}

}  // namespace
}  // namespace zo
