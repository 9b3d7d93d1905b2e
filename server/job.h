// One job on one server (docs/architecture.md, "One training step"): the composition
// the service calls. Each concern lives in its own piece:
//
//   GradientAccumulator  pushes, chunk coverage, the fp32 accumulator
//   StepCoordinator      stats -> lead decides -> commit, lead and follower
//   state_checkpoint.h   this server's state into and out of a checkpoint
//   StateSnapshot        a checkpoint part taken while steps go on
//   TieredOptimizerState the optimizer state (RAM or NVMe sub-groups)
//   ParamVersions        the low-precision versions pulls are served
//   JobPosition          the version, the health, and the calls that wait on them
//   OwnCheckpointPart    this server's part of a checkpoint, written while steps go on
//   LeadCheckpoints      the lead's checkpoints across the servers, a move's freeze
//   LeadRecovery         the lead's watch over its followers, and rollbacks
//   LeadRestore          the lead's restore of every server from a checkpoint
//
// Job owns the step thread that joins them:
//
//   accumulator Ready() -> Stats -> coordinator round -> the commit
//     -> fused Adam over the owned chunks, releasing chunks as it goes
//     -> version t served; pushes for step t + 1 proceed
//
// With a speculative update (zo.speculative_update, job_speculation.cc) each
// chunk is updated as soon as its gradients are in, with the constants the
// step has if it is applied unclipped (StepCoordinator::GuessUnclipped),
// into the optimizer state's second bank; the commit then either keeps that
// (its inputs are the guess: the rest of the chunks are updated and the bank
// becomes the state) or drops it and updates as above. The state, the
// versions served and the pulls never see a speculation that is not kept.
//
// and, on the lead, checkpoints (begun between steps, finished in the
// background while the steps go on) and restores. Every RPC
// handler validates its request fully before touching state.
//
// Thread-safe: handlers run on gRPC threads; one step thread per job. Lock
// order: state_lock_, then position_'s, then the other pieces' own mutexes;
// recovery_ is called holding none of them (its actions take position_'s),
// and restore_, checkpoints_.Run and Request too (their actions take
// state_lock_ and position_'s).
#ifndef ZO_SERVER_JOB_H_
#define ZO_SERVER_JOB_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/wake_queue.h"
#include "offload/aligned_buffer.h"
#include "offload/checkpoint/checkpoint_dir.h"
#include "offload/cpu_optimizer.h"
#include "offload/ranged_constants.h"
#include "offload/thread_pool.h"
#include "offload/tier/tiered_state.h"
#include "proto/zo/v1/checkpoint.pb.h"
#include "proto/zo/v1/coordination.pb.h"
#include "proto/zo/v1/gradients.pb.h"
#include "proto/zo/v1/job.pb.h"
#include "proto/zo/v1/params.pb.h"
#include "rpc/in_process_route.h"
#include "server/compensation_record.h"
#include "server/gradient_accumulator.h"
#include "server/gradient_piece_view.h"
#include "server/job_counters.h"
#include "server/job_position.h"
#include "server/job_spec.h"
#include "server/job_state_lock.h"
#include "server/lead_checkpoints.h"
#include "server/lead_recovery.h"
#include "server/lead_restore.h"
#include "server/own_checkpoint_part.h"
#include "server/param_group_layout.h"
#include "server/param_versions.h"
#include "server/peer_client.h"
#include "server/pull_cursor.h"
#include "server/pull_fills.h"
#include "server/step_coordinator.h"
#include "server/wait_list.h"

namespace zo {

// What the server lends its jobs.
struct JobResources {
  ThreadPool* pool = nullptr;
  PeerClient* peers = nullptr;
  // Runs the callbacks of calls waiting on the job (pushes, pulls).
  WakeQueue* wakes = nullptr;
  // Overrides the config's offload_optimizer.nvme_path when set.
  std::string nvme_root;
  // Bytes of optimizer state a job may keep in RAM; < 0: no limit.
  int64_t ram_budget_bytes = -1;
  // Where the lead writes checkpoints; empty: checkpoints are refused.
  std::string checkpoint_root;
  // After each checkpoint the lead removes the job's older ones beyond
  // this many; 0: keeps them all.
  int keep_checkpoints = 0;
  // Steps between log lines; 0: the config's steps_per_print.
  int log_every = 0;
  // Deadline of each call to another server (retried until the step is
  // aborted by a restore or the job stops).
  absl::Duration peer_timeout = absl::Seconds(30);
  // Jobs one server holds at most; opening another is RESOURCE_EXHAUSTED.
  int max_jobs = 64;
  // RAM the host can still hand out, checked before a job allocates;
  // empty: /proc/meminfo's MemAvailable (AvailableHostMemory). For tests.
  std::function<std::optional<int64_t>()> available_ram;
  // Fault injection for soak tests: every NVMe swap read and write takes at
  // least this long (a slow disk, offload/io/fault_injecting_backend.h).
  absl::Duration nvme_latency;
  // Tests: called on the step thread after a speculative update, with its
  // step and the chunks of it updated so far.
  std::function<void(int64_t step, int64_t chunks)> speculated;
  // Tests: called on the step thread once a step is decided and about to
  // be applied, before its update takes the state.
  std::function<void(int64_t step)> applying;
  // Tests: called on the step thread when a kept speculation's step has
  // every chunk updated and its version begun, before the version is
  // written whole.
  std::function<void(int64_t step)> committing;
};

class Job {
 public:
  static absl::StatusOr<std::unique_ptr<Job>> Create(JobSpec spec, const JobResources& resources);
  ~Job();  // Stop()

  const JobSpec& spec() const { return spec_; }
  bool is_lead() const { return spec_.server_index == 0; }
  v1::JobStatus Status() const;
  // Status once no decided step is still being applied (at most
  // `max_wait`): what a worker attaching mid-run gets, so that it resumes
  // after that step, on weights the servers still hold (a pull of the
  // version the update replaces would find it gone).
  v1::JobStatus StatusForAttach(absl::Duration max_wait = absl::Seconds(5)) const;

  // Worker calls.
  absl::Status InitParams(const v1::ParamInitPiece& piece);
  // A gradient piece, without blocking: GradientAccumulator::TryPush after
  // checking the chunk and dtype. A gRPC reactor's way in, and (with
  // `lent`) the in-process route's.
  absl::StatusOr<GradientAccumulator::PushOutcome> TryPushGradient(
      const GradientPieceView& piece, GradientAccumulator::PushWait* wait,
      std::function<void()> wake, std::shared_ptr<const void> lent = nullptr);
  bool CancelPushWait(const GradientPieceView& piece, const GradientAccumulator::PushWait& wait);
  // The in-process route: where the accumulator keeps `piece`'s `elems`
  // elements (GradientAccumulator::LendPlace) after the checks a push of
  // the piece gets; an empty span where it cannot lend them.
  absl::StatusOr<absl::Span<std::byte>> LendGradientPlace(const GradientPieceView& piece,
                                                          int64_t elems);
  // The same, blocking while the piece's chunk still updates, at most until
  // `deadline`.
  absl::Status PushGradient(const GradientPieceView& piece, absl::Time deadline);
  // Streams the pieces of the request this server owns through `emit`,
  // which returns false when the caller is gone: CheckPullRequest,
  // WaitForVersion, then OpenPull's cursor to its end.
  absl::Status PullParams(const v1::PullParamsRequest& request, absl::Time deadline,
                          const std::function<bool(const v1::ParamPiece&)>& emit);
  // FAILED_PRECONDITION saying where the job is now (rpc/job_move.h) when a
  // call names another instance of it than this one: the job was opened
  // again, or restored, since the caller's client opened it. 0: unchecked.
  absl::Status CheckIncarnation(uint64_t incarnation) const;
  // The parts of PullParams, for a caller that writes asynchronously.
  // INVALID_ARGUMENT for tensors outside the manifest, a negative version
  // or a stripe out of range.
  absl::Status CheckPullRequest(const v1::PullParamsRequest& request) const;
  // PullParamsRequest.stripes' bound (a worker's connections to a server).
  static constexpr int kMaxPullStripes = 64;
  // Without blocking: true when the job has `version`, or with
  // `while_written` when its update is writing it (served from the master:
  // OpenPull's reads then follow the update range by range). Otherwise
  // `wake` is kept, *ticket set, and false returned; the wake is posted once
  // when the version comes or begins to be written, the job needs a restore
  // or stops: ask again then. FAILED_PRECONDITION while the job needs a
  // restore, UNAVAILABLE once stopped.
  absl::StatusOr<bool> AwaitVersion(int64_t version, std::function<void()> wake,
                                    WaitList::Ticket* ticket, bool while_written = false);
  // Takes back a kept wake; false when it was already posted.
  bool CancelVersionWait(WaitList::Ticket ticket);
  // AwaitVersion, blocking the calling thread, at most until `deadline`
  // (DEADLINE_EXCEEDED).
  // `incarnation` (nonzero) is checked at each wake: a restore meanwhile
  // ends the wait with CheckIncarnation's answer.
  absl::Status WaitForVersion(int64_t version, absl::Time deadline, uint64_t incarnation = 0);
  // The request's pieces of a version the job has, or with `while_written`
  // is writing (FAILED_PRECONDITION for one it does not have yet or no
  // longer holds, or whose update failed while the cursor read it;
  // UNAVAILABLE while a restore replaces them). A cursor on a version being
  // written blocks in its reads until the update has done their ranges:
  // for a caller's own thread (the in-process route), never a gRPC
  // reactor's.
  absl::StatusOr<PullCursor> OpenPull(const v1::PullParamsRequest& request,
                                      bool while_written = false);
  // After a cursor opened with `while_written` has read everything: waits
  // for the update writing `version` (if one still does) to end, so that the
  // pull answers only once the version is the job's (a status asked after
  // it shows it); FAILED_PRECONDITION when the update did not make it.
  absl::Status AwaitWritten(int64_t version);
  // The in-process route, before it waits for the request's version: when
  // that version is the next one and its update has not begun (and
  // versions are served from the master), registers where each range goes
  // (`place` says, as for PullCursor::ReadInto) so that the update writes
  // them as it goes (server/pull_fills.h). 0 when it does not; the caller
  // keeps the places valid until TakeFilledPull or WithdrawPull.
  absl::StatusOr<PullFills::Id> RegisterPull(const v1::PullParamsRequest& request,
                                             InProcessRoute::Place place);
  // The same-host route's: the same for a pull into the caller's shared
  // region, whose weights `area` holds the server's elements at their local
  // offsets.
  absl::StatusOr<PullFills::Id> RegisterPullInto(const v1::PullParamsRequest& request,
                                                 absl::Span<std::byte> area);
  // Once AwaitVersion said the version is there (or being written): the
  // pull's answer when its update filled it (waiting while it still
  // writes), nullopt when not (read it with OpenPull then: the parts a
  // dropped speculation wrote ahead hold the version's bytes again, so an
  // unchanged version leaves true weights). Removes the registration.
  absl::StatusOr<std::optional<InProcessRoute::PullResult>> TakeFilledPull(int64_t version,
                                                                           PullFills::Id id);
  // Removes a registration; no write into its places follows.
  void WithdrawPull(PullFills::Id id);
  // A pull served: its time goes into the next step's log line and, with
  // its bytes, into the totals.
  void RecordPull(absl::Duration serve, int64_t bytes) { counters_.AddPull(serve, bytes); }
  // Totals since the job opened, and its NVMe swap's I/O: for metrics.
  JobTotals Totals() const { return counters_.Totals(); }
  SwapIoStats SwapStats() const { return state_->swap_io_stats(); }

  // Server-to-server calls.
  absl::Status OnStepStats(const v1::StepStats& stats);
  absl::Status OnCommit(const v1::StepCommit& commit);
  // A worker's learning rates for a step (zo.client_lr), for this instance of
  // the job (its incarnation checked): StepCoordinator::OnStepLr.
  absl::Status OnStepLr(const v1::StepLrRequest& request);
  // zo.dpu.compensation "worker": once `step` is decided here (at most until
  // `deadline`), the terms of this server's tensor parts
  // (server/compensation_record.h). FAILED_PRECONDITION for a job without it.
  absl::StatusOr<v1::StepCompensation> StepCompensation(int64_t step, absl::Time deadline);
  absl::StatusOr<v1::WriteCheckpointPartResponse> WriteCheckpointPart(
      const v1::WriteCheckpointPartRequest& request, absl::Time deadline);
  // `healthy_after` false (the lead, whose followers restore next): the job
  // still reads as restoring when its part is back; Restore makes it healthy.
  absl::Status RestorePart(const v1::RestorePartRequest& request, bool healthy_after = true);

  // Lead only: run a checkpoint between steps / restore every server.
  // `freeze`: once committed, decide no further step until Thaw (the first
  // half of a move).
  absl::StatusOr<v1::CheckpointResponse> Checkpoint(int64_t min_version, absl::Time deadline,
                                                    bool freeze = false);
  // Lifts a freeze; a no-op without one.
  void Thaw();
  // Checkpoint requests waiting for their version.
  size_t pending_checkpoints() const { return checkpoints_.waiting(); }
  // A checkpoint begun and not yet committed or failed (its part still being
  // written while steps go on).
  bool checkpoint_running() const { return checkpoints_.running(); }
  // `rollback`: RestoreRequest.rollback (a new instance of the job). A
  // follower that answers it holds no part of the job (it restarted) gets
  // its part opened again (OpenJobRequest.by_lead) and restored with the
  // rest.
  // One at a time; `if_restores` (RestoreRequest.if_restores): only while
  // that many restores have finished, else nothing (already_restored).
  absl::StatusOr<v1::RestoreResponse> Restore(const std::string& path, absl::Time deadline,
                                              bool rollback = false,
                                              std::optional<int64_t> if_restores = std::nullopt);

  // A follower's part that its lead opened to restore it
  // (OpenJobRequest.by_lead): it refuses steps until RestorePart, and its
  // server refuses workers' opens until then (JobRegistry::Open).
  void AwaitLeadRestore();
  bool AwaitingLeadRestore() const;
  // A lead created empty while its followers hold the job at
  // `followers_version` > 0 (it restarted): refuses steps and rolls every
  // server back to the latest checkpoint in the background (or, with none,
  // fails the job for good, as for a lost follower).
  void RecoverOwnPart(int64_t followers_version);

  // Ends the step thread and wakes every waiting call, which then fail with
  // `reason`; idempotent (the first reason stays).
  void Stop(absl::Status reason = absl::UnavailableError("the server is shutting down"));

  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

 private:
  Job(JobSpec spec, const JobResources& resources);
  // The job's pieces, in order: Init's steps.
  absl::Status Init();
  // Where the optimizer state lives (RAM, or NVMe sub-groups beyond the RAM
  // budget); RESOURCE_EXHAUSTED when it is RAM only and over the budget.
  absl::StatusOr<TieredStateOptions> OptimizerStateOptions() const;
  absl::Status CreateOptimizerState(const TieredStateOptions& options);
  absl::Status CreateAccumulator(std::vector<LocalChunk> owned);
  absl::Status CreateVersions();
  void CreateCoordinator();
  void CreateCompensationRecord();
  // RESOURCE_EXHAUSTED, before anything is allocated, when the job's RAM on
  // this server (optimizer state in RAM, swap buffers, gradient buffer, the
  // stored 16-bit versions) exceeds what the host has available; else the
  // bytes that stay available (nullopt when the host cannot tell).
  absl::StatusOr<std::optional<int64_t>> CheckHostMemory(const TieredStateOptions& options) const;
  // The speculative update (job_speculation.cc). Why this job cannot
  // speculate exactly or within its memory (`spare`: what CheckHostMemory
  // left), "" when it can.
  std::string WhyNoSpeculation(std::optional<int64_t> spare) const;
  // Decides whether the job speculates and reserves the state's bank;
  // says which at the job's start. Before the accumulator is created.
  void SetUpSpeculation(std::optional<int64_t> spare);
  // The step thread: updates the chunks that filled since it last looked
  // into the bank, once the step's inputs can be guessed.
  void Speculate(const JobPosition::Work& work);
  // Local chunk `index` into the bank with constants `c` of `step`, its
  // weights written ahead into the step's in-process pulls; the caller holds
  // state_lock_. `all_workers`: no push needs a core meanwhile.
  absl::Status SpeculateChunk(int index, const RangedConstants<AdamStepConstants>& c, int64_t step,
                              bool all_workers);
  // Chunks of `step` (of `generation`) in the bank: 0 when none.
  int64_t SpeculatedChunks(int64_t step, int64_t generation) const;
  // The commit's inputs are what the speculation assumed.
  bool SpeculationHolds(const v1::StepCommit& commit) const;
  // Apply for a commit the speculation holds for: the rest of the chunks
  // into the bank, which becomes the state; pulls are served from it.
  absl::Status ApplySpeculated(const v1::StepCommit& commit);
  // The optimizer's constants for `inputs`.
  RangedConstants<AdamStepConstants> ConstantsOf(const StepInputs& inputs) const;

  // Validation shared by the worker calls; returns the local chunk index.
  absl::StatusOr<int> LocalChunkIndex(int64_t chunk) const;
  // `error` of a push, or where the job is now when a restore since made the
  // piece's incarnation stale.
  absl::Status RestoredSince(const GradientPieceView& piece, absl::Status error) const;
  // LocalChunkIndex, the piece's dtype is the job's, and its incarnation.
  absl::StatusOr<int> PushedChunkIndex(const GradientPieceView& piece) const;

  // Pulls round the master as they read it when it all lies in RAM
  // (ParamVersions::CreateFromMaster); with sub-groups on NVMe the served
  // copies are stored.
  static bool ServesFromMaster(int64_t nvme_sub_groups) { return nvme_sub_groups == 0; }
  // The step thread: waits for work (JobPosition::AwaitWork), then runs a
  // due checkpoint or the open step.
  void StepLoop();
  // What the step thread waits for: a checkpoint due (lead), every
  // gradient in, and the lead's probe of its followers meanwhile.
  JobPosition::WorkTests StepWorkTests();
  // Stats, the coordinator's round, the update, the new version published.
  void RunStep(const JobPosition::Work& work);
  // The lead's recovery (recovery_) and restore (restore_), acting on this job.
  RecoveryActions RecoveryActionsForThis();
  LeadRestore::Options RestoreOptionsForThis() const;
  RestoreActions RestoreActionsForThis();
  // Fails the job for good (health DATA_LOSS, saying what the operator can
  // do): `what_happened` (a server lost its part) and `why` no checkpoint
  // restores it.
  void MarkLost(const std::string& what_happened, const absl::Status& why);
  // Follower: the lead answered `answer` (NO_JOB): it restarted empty, and
  // the version the workers wait for will not come. Refuses steps and
  // fails the pulls that wait (UNAVAILABLE), so that workers that never
  // call the lead hear of it too, until the lead's restore reaches here.
  void LeadLostTheJob(const absl::Status& answer);
  // Follower: a report the lead took after LeadLostTheJob (it holds the job
  // after all, and no restore came between): healthy again.
  void LeadAnswered();
  // The position's health hook: closes the accumulator while the job needs
  // a restore (pushes fail with the reason), or reopens it.
  void HealthChanged(const absl::Status& health);
  v1::StepStats ComputeStepStats(int64_t step, int64_t generation);
  absl::Status Apply(const v1::StepCommit& commit);
  // Every parameter group's learning rate in `commit`.
  std::vector<double> GroupLrOf(const StepInputs& inputs) const;
  // The constants of the step that made the version `meta` restores.
  RangedConstants<AdamStepConstants> RestoredStepConstants(const CheckpointMeta& meta) const;
  // Recomputes the weights before the step with constants `c` from the state
  // it left (served as the previous version: server/param_versions.h).
  ParamVersions::Undo UndoOf(const RangedConstants<AdamStepConstants>& c) const;
  // An update's tile hook: the registered pulls' share of tile `t`.
  void FillPulls(const TieredOptimizerState::UpdatedTile& t) const;
  // Whether a pull of `version` may be registered for its update to write
  // (the next version; checked again when registering).
  bool CanFill(int64_t version) const;
  // A pull of some of the tensors (not all) is answered as soon as its
  // ranges are written (PullFills, `early`); one of the whole version once
  // the version is the job's.
  absl::StatusOr<PullFills::Id> RegisterCopies(const v1::PullParamsRequest& request,
                                               std::vector<PullFills::Copy> copies);
  // Where the request's elements lie in this server's local index space.
  std::vector<PullCursor::Range> PullRanges(const v1::PullParamsRequest& request) const;
  const std::vector<LocalChunk>& chunks() const { return accum_->chunks(); }
  // The lead's checkpoints (checkpoints_), acting on this job.
  LeadCheckpoints::Options CheckpointOptionsForThis() const;
  CheckpointActions CheckpointActionsForThis();
  // Lead: the commit record's fields as of `version` (CheckpointActions::
  // describe).
  uint32_t DescribeCheckpoint(int64_t version, CheckpointMeta& meta) const;
  // Lead: fills the commit record's "previous" for a checkpoint of
  // `version` (the job is at it, holding versions from `oldest_version`),
  // and returns the bytes per element each part carries of that version's
  // weights (0: none).
  uint32_t PlanPrevious(int64_t version, int64_t oldest_version, CheckpointMeta& meta) const;
  // This server's part (own_part_), begun once the job is at `version` and
  // healthy; finished letting steps carry its NVMe part for as long as the
  // next step may take.
  absl::Status BeginOwnPart(int64_t version, const std::string& dir, uint32_t previous_bytes);
  absl::StatusOr<v1::WriteCheckpointPartResponse> FinishOwnPart(int64_t version,
                                                                const std::string& dir);
  // `speculated`: chunks of the step updated before it was decided, `kept`
  // whether the decision kept them.
  void LogStep(const v1::StepCommit& commit, absl::Duration wait, absl::Duration update,
               int64_t speculated, bool kept);

  const JobSpec spec_;
  const JobResources resources_;
  const ShardMap& map_;
  // JobStatus.incarnation; a restore makes a new one (calls from before it
  // belong to steps the restore undid).
  std::atomic<uint64_t> incarnation_;
  int64_t local_elems_ = 0;
  std::optional<ParamGroupLayout> groups_;  // set by Init

  std::unique_ptr<TieredOptimizerState> state_;
  std::unique_ptr<GradientAccumulator> accum_;
  std::unique_ptr<ParamVersions> versions_;
  std::unique_ptr<PullFills> fills_;  // with versions served from the master
  std::unique_ptr<StepCoordinator> coordinator_;
  std::unique_ptr<CompensationRecord> compensation_;  // with zo.dpu.compensation

  // Why the job does not speculate ("" when it does; set by Init).
  std::string no_speculation_;
  // The step thread's: the speculation under way.
  struct Speculation {
    int64_t step = -1;
    int64_t generation = -1;
    std::optional<StepInputs> guess;  // once it could be guessed
    std::vector<int> waiting;         // filled chunks the guess has yet to come for
    int64_t chunks = 0;               // updated into the bank
    // Per chunk, the gradient statistics taken when it was speculated: the
    // step's statistics do not read those chunks again.
    std::vector<std::optional<GradStats>> stats;
    std::vector<bool> in_bank;  // per chunk
  };
  Speculation speculation_;
  // The step thread's: the last decided step was clipped. A step after one
  // is not speculated on (while clipping stays on, every speculation would
  // be updated again); the first unclipped step ends that.
  bool last_step_clipped_ = false;

  // Held while the optimizer state or the accumulator is read or written as
  // a whole (stats, update, checkpoint, restore). Taken before position_'s mutex.
  JobStateLock state_lock_;
  // This server's checkpoint part; its hooks run in every step while one is
  // under way. Shares state_lock_.
  std::unique_ptr<OwnCheckpointPart> own_part_;

  // The version, health and stop, and the calls that wait on them.
  JobPosition position_{{.job = spec_.name,
                         .lead = spec_.servers[0],
                         .initial_loss_scale = LossScaler::FromConfig(spec_.config).scale(),
                         .wakes = resources_.wakes,
                         .on_health = [this](const absl::Status& h) { HealthChanged(h); }}};
  JobCounters counters_;

  // Lead: the restore across the servers, one at a time. Called holding
  // none of the job's locks (its actions take them).
  LeadRestore restore_{RestoreOptionsForThis(), RestoreActionsForThis()};

  // Lead: what each follower answered last, and the rollback when a
  // server lost its part. Called holding none of the job's locks.
  LeadRecovery recovery_{spec_.name, spec_.servers, RecoveryActionsForThis()};

  // Lead: checkpoint requests, the round across the servers, the freeze of
  // a move. It takes none of the job's locks.
  LeadCheckpoints checkpoints_{CheckpointOptionsForThis(), CheckpointActionsForThis()};

  std::thread step_thread_;
};

}  // namespace zo

#endif  // ZO_SERVER_JOB_H_
