#include "worker/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/cpu_features.h"
#include "common/status_context.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "rpc/error_detail.h"
#include "rpc/job_move.h"
#include "worker/backend/select_backend.h"
#include "worker/client/offload_client.h"
#include "worker/train/attach.h"
#include "worker/train/batch_sources.h"
#include "worker/train/checkpoint_in_flight.h"
#include "worker/train/plan.h"
#include "worker/train/progress.h"
#include "worker/train/step_outcomes.h"
#include "worker/train/train_metrics.h"

namespace zo::train {
namespace {

// --restore: the job goes back to a checkpoint before any stage attaches, so
// every stage's client starts from the restored version. Safe to repeat and
// to give every stage process: a job already at its latest checkpoint is
// left as it is (this command ran before), of processes that find it needing
// one at the same time the lead lets one restore it (RestoreOnce), and a job
// that went on past it is not rolled back without --restore-force.
absl::Status RestoreJob(const TrainOptions& o, const Plan& plan) {
  ZO_ASSIGN_OR_RETURN(
      std::unique_ptr<OffloadClient> client,
      OffloadClient::Open(MakeClientOptions(o), o.config_json, plan.model.Manifest(plan.dtype)));
  // One reading of the lead decides, and its restore count goes with it.
  ZO_ASSIGN_OR_RETURN(const v1::JobStatus lead, client->JobStatus());
  const int64_t live = lead.version();
  if (lead.restoring()) {
    std::fprintf(o.out, "zo-train: job '%s' is being restored already: %s\n", o.job.c_str(),
                 lead.needs_restore().c_str());
    return absl::OkStatus();
  }
  if (live > 0 && !o.restore_force) {
    const int64_t checkpoint = lead.last_checkpoint_step();
    if (o.restore == "latest" && checkpoint == live) {
      std::fprintf(o.out,
                   "zo-train: job '%s' is at version %lld, its latest checkpoint: nothing to "
                   "restore\n",
                   o.job.c_str(), static_cast<long long>(live));
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "--restore ", o.restore, ": job ", o.job, " is live at version ", live,
        checkpoint >= 0 ? absl::StrCat(", past its latest checkpoint (step ", checkpoint, ")")
                        : std::string(" and has no checkpoint on record"),
        "; restoring would roll it back. Leave --restore out to go on from version ", live,
        ", or add --restore-force to roll back"));
  }
  ZO_ASSIGN_OR_RETURN(const v1::RestoreResponse restored,
                      client->RestoreOnce(o.restore == "latest" ? "" : o.restore, lead.restores()));
  std::fprintf(o.out, "zo-train: %s job '%s' to version %lld from %s\n",
               restored.already_restored() ? "another process restored" : "restored", o.job.c_str(),
               static_cast<long long>(restored.version()),
               o.restore == "latest" ? "its latest checkpoint" : o.restore.c_str());
  return absl::OkStatus();
}

// Runs one step on every local stage (threads when there are several) and
// reports the slowest stage's time in each part of the step.
absl::StatusOr<StepReport> RunStep(std::vector<LocalStage>& local,
                                   pipeline::InProcessFabric* fabric, int64_t step) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<absl::StatusOr<pipeline::StepTimes>> times(local.size());
  if (local.size() == 1) {
    times[0] = local[0].executor->RunStep(step);
  } else {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < local.size(); ++i) {
      threads.emplace_back([&, i] {
        times[i] = local[i].executor->RunStep(step);
        // One failed stage must not leave its neighbours waiting.
        if (!times[i].ok()) fabric->Abort(times[i].status());
      });
    }
    for (auto& t : threads) t.join();
  }
  StepReport report;
  report.step = step;
  report.step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (auto& t : times) {
    if (!t.ok()) return t.status();
    report.compute_s = std::max(report.compute_s, t->compute_s);
    report.push_s = std::max(report.push_s, t->push_s);
    report.wait_s = std::max(report.wait_s, t->pull_s);
    report.transfer_s = std::max(report.transfer_s, t->transfer_s);
  }
  report.loss_scale = local.front().link->LossScale(step);
  for (LocalStage& ls : local) {
    if (ls.module->has_loss()) report.loss = ls.module->step_loss();
  }
  return report;
}

// The job's version on its servers; tells `outcomes` what they made of the
// steps (applied or skipped, grad norm, lr).
absl::StatusOr<int64_t> ObserveJob(OffloadClient& client, StepOutcomes& outcomes) {
  ZO_ASSIGN_OR_RETURN(v1::JobStatus status, client.JobStatus());
  outcomes.Observe(status.version(), status.applied_steps(), status.last_skipped(),
                   status.last_grad_norm(), status.last_lr());
  return status.version();
}

// A job that moved can be followed by a process that runs all of its
// stages; stages in other processes would have to agree on where to resume.
absl::Status CanFollow(const TrainOptions& o, const JobMove& move) {
  if (!o.servers.empty() && (o.stage < 0 || o.pipeline_stages == 1)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("job ", o.job, " moved to servers ", absl::StrJoin(move.servers, ","),
                   " at version ", move.version, "; restart this worker with --servers ",
                   absl::StrJoin(move.servers, ","), " (it resumes where the job is)"));
}

// The servers applied a step this worker is still computing: it restarted
// after its last push of that step. Its pull then finds the version the step
// computes on replaced, or its push finds the chunk taking a later step.
bool JobWentOnWithout(const absl::Status& failed) {
  const v1::ErrorDetail::Reason why = ReasonOf(failed);
  return why == v1::ErrorDetail::VERSION_NOT_HELD || why == v1::ErrorDetail::STEP_NOT_OPEN;
}

// Stages as threads share the cores: OpenBLAS threads per stage times
// stages should not exceed them.
absl::StatusOr<std::unique_ptr<backend::Backend>> OpenBackend(const TrainOptions& o) {
  const int stages_here = o.stage < 0 ? o.pipeline_stages : 1;
  int blas_threads = o.blas_threads;
  if (blas_threads == 0 && stages_here > 1) {
    blas_threads = std::max(1, HostThreads() / stages_here);
  }
  std::string backend_why;
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<backend::Backend> backend,
                      backend::SelectBackend({.device = o.device,
                                              .gpu = o.gpu,
                                              .deterministic = o.deterministic,
                                              .blas_threads = blas_threads},
                                             &backend_why));
  std::fprintf(o.out, "zo-train: computing with %s\n", backend_why.c_str());
  return backend;
}

// This data-parallel rank's batches: the plan's text for GPT-lite,
// synthetic ones for the MLP. Borrows the plan's text.
std::unique_ptr<model::BatchSource> MakeBatchSource(const TrainOptions& o, const Plan& plan) {
  if (plan.text) {
    return std::make_unique<TextBatchSource>(*plan.text, plan.micro_batch_size, o.gpt.block_size,
                                             plan.micro_batches, o.dp_rank, o.dp_world_size);
  }
  return std::make_unique<MlpBatchSource>(o.mlp, o.seed, plan.micro_batch_size, o.dp_rank);
}

// Says where training starts; false when the job is at --steps already.
bool SayWhereTrainingStarts(const TrainOptions& o, int64_t version) {
  if (version >= o.steps) {
    std::fprintf(o.out,
                 "zo-train: job '%s' is at step %lld already (--steps %lld): nothing to do\n",
                 o.job.c_str(), static_cast<long long>(version), static_cast<long long>(o.steps));
    return false;
  }
  if (version > 0) {
    std::fprintf(o.out, "zo-train: attached to job '%s' at version %lld; resuming at step %lld\n",
                 o.job.c_str(), static_cast<long long>(version),
                 static_cast<long long>(version + 1));
  }
  return true;
}

// Adds `client`'s bytes to `total`; no client, nothing.
void AddTraffic(const OffloadClient* client, OffloadClient::Traffic& total) {
  if (client == nullptr) return;
  total.pushed_bytes += client->traffic().pushed_bytes;
  total.pulled_bytes += client->traffic().pulled_bytes;
}

// The steps of one run, from the job's version + 1 to --steps. A step that
// fails because the job moved, or lost a server, or went on without this
// worker, is followed to where the job is and run from there; any other
// failure ends the run. Each step is reported once, and checkpointed as
// asked. Borrows what it is given for its lifetime and replaces `at` when
// the job moves. Used from the thread that calls Train.
class StepLoop {
 public:
  // `version`: the job's version the stages attached at.
  StepLoop(const TrainOptions& o, Plan& plan, backend::Backend& backend, model::BatchSource& source,
           Attached& at, Progress& progress, int64_t version)
      : o_(o),
        plan_(plan),
        backend_(backend),
        source_(source),
        at_(at),
        progress_(progress),
        checkpoints_here_(at.local.front().stage == 0 && o.dp_rank == 0),
        reported_(version),
        placement_(o) {}

  absl::Status Run();
  // Once every step ran: waits for the checkpoint in flight and for the
  // servers' last step, and prints the summary. A run that ends on a failed
  // checkpoint is an error.
  absl::Status Finish();

 private:
  // The first local stage's client: the job's state as this worker sees it.
  OffloadClient& first_client() { return *at_.local.front().client; }

  std::optional<JobMove> MoveAfter(const absl::Status& failed, int64_t step);
  absl::StatusOr<int64_t> Follow(const JobMove& move);
  absl::Status Complete(int64_t step, StepReport report);
  OffloadClient::Traffic TrafficSoFar() const;
  void CloseResendClients();
  absl::Status WaitForLastStep();

  const TrainOptions& o_;
  Plan& plan_;
  backend::Backend& backend_;
  model::BatchSource& source_;
  Attached& at_;
  Progress& progress_;
  const bool checkpoints_here_;
  StepOutcomes outcomes_;
  CheckpointInFlight checkpoint_;
  // Byte totals of the clients already closed (resend ones, a moved job's),
  // for metrics.
  OffloadClient::Traffic traffic_before_;
  // A step after a move may be one this worker already finished on the old
  // servers (its push was taken before the job was held): it runs again, the
  // same batch on the same weights, but is reported once.
  int64_t reported_;
  TrainOptions placement_;  // o_ with the servers the job is on now
};

absl::Status StepLoop::Run() {
  for (int64_t step = reported_ + 1; step <= o_.steps; ++step) {
    absl::StatusOr<StepReport> ran = RunStep(at_.local, at_.fabric.get(), step);
    const absl::Status failed =
        ran.ok() ? ObserveJob(first_client(), outcomes_).status() : ran.status();
    if (const std::optional<JobMove> move = MoveAfter(failed, step); move.has_value()) {
      ZO_ASSIGN_OR_RETURN(step, Follow(*move));  // the loop's ++ makes it the next step
      continue;
    }
    ZO_RETURN_IF_ERROR(failed);
    ZO_RETURN_IF_ERROR(Complete(step, *std::move(ran)));
  }
  return absl::OkStatus();
}

// Where a failed step says the job is now, saying so; nullopt: the failure
// ends the run (or there was none).
std::optional<JobMove> StepLoop::MoveAfter(const absl::Status& failed, int64_t step) {
  if (std::optional<JobMove> move = ParseJobMove(failed); move.has_value()) {
    progress_.Note(absl::StrCat(
        "zo-train: job ", o_.job, " moved to ", absl::StrJoin(move->servers, ","), " at version ",
        move->version, move->servers == placement_.servers ? " (restored)" : "", "; following it"));
    return move;
  }
  // Only where this process runs every stage: a pipeline stage in another
  // process may be what failed, and the error says which.
  const bool all_stages_here = o_.stage < 0 || o_.pipeline_stages == 1;
  if (placement_.servers.empty() || !all_stages_here) return std::nullopt;
  if (JobWentOnWithout(failed)) {
    // Restarted after its last push of this step: the servers applied it
    // meanwhile (a push finds the chunk at a later step, or the version
    // this step computes on was replaced). Carry on from where they are.
    progress_.Note(absl::StrCat("zo-train: the job went on past step ", step,
                                " (this worker's gradients for it were all in): ", failed.message(),
                                "; catching up"));
    return JobMove{.job = o_.job, .servers = placement_.servers, .version = step};
  }
  const bool lost_job = NoJobOn(failed, o_.job);
  if (!lost_job && !absl::IsUnavailable(failed) && !absl::IsDeadlineExceeded(failed)) {
    return std::nullopt;
  }
  // A server is down, or restarted without the job (its lead then rolls
  // every server back to the last checkpoint): wait for the job on the
  // same servers, at whatever version they are, and carry on from there.
  // At least version 1 once the job has trained: a job that came back
  // fresh at version 0 is not where this one is.
  progress_.Note(absl::StrCat(
      "zo-train: ", failed.message(),
      lost_job ? "; waiting for the job to be rolled back" : "; waiting for the servers"));
  return JobMove{.job = o_.job,
                 .servers = placement_.servers,
                 .version = first_client().version() > 0 ? 1 : 0};
}

// Attaches the stages where the job went; returns the version it is at.
absl::StatusOr<int64_t> StepLoop::Follow(const JobMove& move) {
  ZO_RETURN_IF_ERROR(CanFollow(o_, move));
  checkpoint_.Wait(progress_);  // it uses a client of the old placement
  for (const LocalStage& ls : at_.local) {
    AddTraffic(ls.client.get(), traffic_before_);
    AddTraffic(ls.resend_client.get(), traffic_before_);
  }
  at_ = Attached{};  // executors, modules, links and clients of the old placement
  placement_.servers = move.servers;
  ZO_ASSIGN_OR_RETURN(at_, Reattach(placement_, plan_, backend_, source_, move, progress_));
  const int64_t version = first_client().version();
  progress_.Note(absl::StrCat("zo-train: job ", o_.job, " is at version ", version, " on ",
                              absl::StrJoin(placement_.servers, ","), "; resuming at step ",
                              version + 1));
  return version;
}

// A step that ran: its metrics and progress line (the first time it ran),
// and the checkpoint due after it.
absl::Status StepLoop::Complete(int64_t step, StepReport report) {
  report.samples = int64_t{plan_.micro_batches} * plan_.micro_batch_size;
  if (plan_.text) report.tokens = report.samples * o_.gpt.block_size;
  const bool first_run = step > reported_;
  if (o_.metrics != nullptr && first_run) {
    const OffloadClient::Traffic traffic = TrafficSoFar();
    o_.metrics->Record(report, traffic.pushed_bytes, traffic.pulled_bytes);
  }
  // The step the worker may have died in is done: back to strict pushes.
  if (at_.local.front().resend_client) CloseResendClients();
  if (first_run) {
    ZO_RETURN_IF_ERROR(progress_.Step(report, outcomes_));
    reported_ = step;
  }
  checkpoint_.Poll(progress_);
  if (checkpoints_here_ && o_.checkpoint_every > 0 && step % o_.checkpoint_every == 0) {
    checkpoint_.Start(at_.local.front().client.get(), step, progress_);
  }
  return absl::OkStatus();
}

// Bytes pushed and pulled in this run, by every client it had.
OffloadClient::Traffic StepLoop::TrafficSoFar() const {
  OffloadClient::Traffic total = traffic_before_;
  for (const LocalStage& ls : at_.local) {
    AddTraffic(ls.client.get(), total);
    AddTraffic(ls.resend_client.get(), total);
  }
  return total;
}

void StepLoop::CloseResendClients() {
  for (LocalStage& ls : at_.local) {
    AddTraffic(ls.resend_client.get(), traffic_before_);
    ls.link->set_client(ls.client.get());
    ls.resend_client.reset();
  }
}

absl::Status StepLoop::Finish() {
  checkpoint_.Wait(progress_);
  ZO_RETURN_IF_ERROR(WaitForLastStep());
  ZO_RETURN_IF_ERROR(progress_.Finish(outcomes_));
  if (const std::optional<backend::Backend::Allocation> allocated = backend_.allocation();
      allocated.has_value() && o_.device_memory_budget > 0) {
    std::fprintf(
        o_.out, "zo-train: tensors on the device at their peak: %lld bytes (%s) of the %s budget\n",
        static_cast<long long>(allocated->peak_bytes), FormatBytes(allocated->peak_bytes).c_str(),
        FormatBytes(o_.device_memory_budget).c_str());
  }
  if (plan_.streams()) {
    int64_t host = 0;
    for (const LocalStage& ls : at_.local) host += ls.link->host_bytes();
    std::fprintf(o_.out,
                 "zo-train: host memory for streamed weights and staged gradients: %lld bytes "
                 "(%s)\n",
                 static_cast<long long>(host), FormatBytes(static_cast<double>(host)).c_str());
  }
  // Trained, but the job's newest checkpoint is older than asked: a run
  // that ends on a failed checkpoint does not exit 0.
  const absl::Status& failure = checkpoint_.last_failure();
  if (!failure.ok()) {
    return WithMessage(failure, absl::StrCat("training finished, but ", failure.message(),
                                             " (the job keeps its last committed checkpoint)"));
  }
  return absl::OkStatus();
}

// With DPU the servers finish the last step after the worker; wait for it
// (a minute at most) so every step's outcome is known.
absl::Status StepLoop::WaitForLastStep() {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (;;) {
    ZO_ASSIGN_OR_RETURN(int64_t now, ObserveJob(first_client(), outcomes_));
    if (now >= o_.steps || absl::Now() > deadline) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(5));
  }
}

}  // namespace

absl::Status Train(const TrainOptions& given) {
  TrainOptions o = given;
  ZO_RETURN_IF_ERROR(CheckOptions(o));
  ZO_ASSIGN_OR_RETURN(Plan plan, MakePlan(o));
  PrintPlan(o, plan);
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<backend::Backend> backend, OpenBackend(o));
  ZO_RETURN_IF_ERROR(ChooseGradientAccumulation(*backend, o, plan));
  const std::unique_ptr<model::BatchSource> source = MakeBatchSource(o, plan);

  if (!o.restore.empty()) ZO_RETURN_IF_ERROR(RestoreJob(o, plan));
  ZO_ASSIGN_OR_RETURN(Attached at, AttachAtStart(o, plan, *backend, *source));
  const int64_t version = at.local.front().client->version();
  if (!SayWhereTrainingStarts(o, version)) return absl::OkStatus();
  ZO_ASSIGN_OR_RETURN(
      Progress progress,
      Progress::Open(o.out, version + 1, o.steps, plan.config.steps_per_print, o.metrics_out));
  StepLoop loop(o, plan, *backend, *source, at, progress, version);
  ZO_RETURN_IF_ERROR(loop.Run());
  return loop.Finish();
}

}  // namespace zo::train
