// The agreement of a job's servers on each step (docs/architecture.md,
// "Global decisions"): every server's per-chunk gradient statistics go to
// the lead (server 0), the lead decides the step for all (StepDecider) and
// commits the decision to every follower, and each server then applies it.
//
//   follower: FollowerRound(own stats) -> ReportStats to the lead (retried)
//                                     -> waits for OnCommit -> the commit
//   lead:     LeadRound(own stats)     -> waits for every server's OnStepStats
//                                     -> Decide -> SendCommit to each follower
//                                        (retried) -> the commit
//
// A round ends early (nullopt) when it is aborted: Restart (a restore moved
// the job to another generation) or Stop. Messages of another generation, or
// for a step already decided, are ignored, so retries are harmless.
//
// Thread-safety: OnStepStats, OnCommit, Restart, Stop and the decider
// accessors may be called from any thread; rounds are run by one thread (the
// job's step thread), one at a time. The transport functions are called
// without a lock held.
#ifndef ZO_SERVER_STEP_COORDINATOR_H_
#define ZO_SERVER_STEP_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/config.h"
#include "common/sharding.h"
#include "proto/zo/v1/coordination.pb.h"
#include "server/step_decision.h"

namespace zo {

// The inputs `commit` hands the update (a skipped step's are zeros).
StepInputs InputsOf(const v1::StepCommit& commit);

class StepCoordinator {
 public:
  struct Options {
    std::string job;
    const ShardMap* map = nullptr;  // borrowed; outlives the coordinator
    int server_index = 0;           // 0: the lead
    int dp_world_size = 1;
    const Config* config = nullptr;  // lead: the decider's; borrowed
    int num_groups = 1;              // parameter groups, for zo.client_lr
    // Follower: sends this server's statistics to the lead.
    std::function<absl::Status(const v1::StepStats&)> report_stats;
    // Lead: sends the commit to follower `server` (1 .. servers - 1).
    std::function<absl::Status(int server, const v1::StepCommit&)> send_commit;
    // Lead: called every `probe_every` for each server whose statistics the
    // round still waits for (the job checks whether that server lost it).
    std::function<void(int server)> probe;
    absl::Duration probe_every = absl::Seconds(2);
    // First wait between retries of a failed call; doubles up to 2 s.
    absl::Duration initial_backoff = absl::Milliseconds(50);
  };

  explicit StepCoordinator(Options options);

  bool is_lead() const { return server_index_ == 0; }

  // Lead: the round for `own.step()` with this server's statistics.
  // `loss_scale_used` is the scale the step's gradients carry. The decision
  // is a pure function of the statistics in chunk order, whichever server
  // reported them.
  std::optional<v1::StepCommit> LeadRound(const v1::StepStats& own, double loss_scale_used);
  // Follower: reports `own` and waits for the lead's commit of its step.
  std::optional<v1::StepCommit> FollowerRound(const v1::StepStats& own);

  // Lead: a server's statistics (also the lead's own, from LeadRound).
  // INVALID_ARGUMENT for statistics that do not fit the job;
  // FAILED_PRECONDITION on a follower or for a step too far ahead.
  absl::Status OnStepStats(const v1::StepStats& stats);
  // Follower: the lead's decision. FAILED_PRECONDITION for another
  // generation or a step that is not open.
  absl::Status OnCommit(const v1::StepCommit& commit);
  // With zo.client_lr: a dp rank's learning rates (one per parameter group)
  // for `step`, which a worker sends before the step's gradients, so they
  // are here when the lead's round decides (and a follower, which the
  // client tells too, guesses the step with them: GuessUnclipped). The
  // first rank's rates hold; another rank's that differ are
  // INVALID_ARGUMENT, and so are rates of the wrong count or not finite and
  // >= 0. FAILED_PRECONDITION without zo.client_lr or for a step more than
  // two ahead of the open one; a step already decided is ignored (a worker
  // re-sending it). A lead's round that finds no rates for its step fails
  // the job (a client that does not send them cannot be trained with
  // zo.client_lr).
  // `group_hyper`, empty or one per group, is the groups' betas, eps and
  // weight decay for the step (torch.optim's param_groups as a scheduler
  // left them), held to zo.param_groups' rules; FAILED_PRECONDITION for a
  // job that cannot take them (not Adam or AdamW, or zo.dpu.compensation,
  // whose terms assume the job's own).
  absl::Status OnStepLr(int64_t step, int dp_rank, absl::Span<const double> group_lr,
                        absl::Span<const ParamGroupConfig> group_hyper = {});

  // What the commit of the open step will say if it is applied unclipped,
  // its gradients carrying `loss_scale_used`: a speculative update's guess
  // (server/job.h), right whenever the step is neither skipped nor clipped.
  // nullopt when this server cannot know it: with zo.client_lr before the
  // step's rates came, and on a follower after a restore until its first
  // commit.
  std::optional<StepInputs> GuessUnclipped(double loss_scale_used) const;

  // While a round keeps failing to reach another server: "sending the
  // step's commit failing for 14 s: UNAVAILABLE: server 127.0.0.1:7071 ...";
  // empty otherwise. For the job's status and health.
  std::string StallDescription() const;

  // Step `step` is applied: the next one is open.
  void Advance(int64_t step);
  // A restore: generation `generation`, step `open_step` open; aborts the
  // round in progress and drops what was received.
  void Restart(int64_t generation, int64_t open_step);
  // Aborts the round in progress and every later one.
  void Stop();

  // Lead: the decider's state for a checkpoint, and its restore.
  int64_t applied_steps() const;
  LossScalerState scaler_state() const;
  absl::Status RestoreDecider(int64_t applied_steps, const LossScalerState& scaler);

  StepCoordinator(const StepCoordinator&) = delete;
  StepCoordinator& operator=(const StepCoordinator&) = delete;

 private:
  // OnStepLr's rules for a step's betas, eps and weight decay.
  absl::Status CheckGroupHyper(absl::Span<const ParamGroupConfig> group_hyper) const;
  bool AbortedLocked(int64_t generation) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return stop_ || generation != generation_;
  }
  // Retries `call` until it succeeds or the round is aborted; false when aborted.
  bool RetryUntilAborted(int64_t generation, const char* what,
                         const std::function<absl::Status()>& call);

  const std::string job_;
  const ShardMap& map_;
  const int server_index_;
  const Options options_;

  mutable absl::Mutex mu_;
  // The call RetryUntilAborted keeps failing, while it does.
  struct Stall {
    std::string what;
    absl::Status last_error;
    absl::Time since;
  };
  std::optional<Stall> stall_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t open_step_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Follower: the commit of the open step, once it came.
  std::optional<v1::StepCommit> commit_ ABSL_GUARDED_BY(mu_);
  // Follower: the applied steps the last commit counted (0 for a new job;
  // unknown after a restore until a commit comes), and the schedule the
  // lead's decider follows.
  std::optional<int64_t> follower_applied_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<LrSchedule> follower_schedule_;
  // Lead.
  std::optional<StepDecider> decider_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::map<int, v1::StepStats>> partials_
      ABSL_GUARDED_BY(mu_);  // step -> server -> stats
  // With zo.client_lr: what the workers sent for a step (the lead decides
  // with it; a follower guesses with it).
  struct ClientRates {
    std::vector<double> lr;               // one per group
    std::vector<ParamGroupConfig> hyper;  // empty: the job's
    bool operator==(const ClientRates&) const = default;
  };
  std::map<int64_t, ClientRates> client_lr_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zo

#endif  // ZO_SERVER_STEP_COORDINATOR_H_
