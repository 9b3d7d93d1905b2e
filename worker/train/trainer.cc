#include "worker/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_context.h"
#include "common/status_macros.h"
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

}  // namespace

absl::Status Train(const TrainOptions& given) {
  TrainOptions o = given;
  ZO_RETURN_IF_ERROR(CheckOptions(o));
  ZO_ASSIGN_OR_RETURN(Plan plan, MakePlan(o));
  PrintPlan(o, plan);

  // Stages as threads share the cores: OpenBLAS threads per stage times
  // stages should not exceed them.
  const int stages_here = o.stage < 0 ? o.pipeline_stages : 1;
  int blas_threads = o.blas_threads;
  if (blas_threads == 0 && stages_here > 1) {
    blas_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / stages_here);
  }
  std::string backend_why;
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<backend::Backend> backend,
                      backend::SelectBackend({.device = o.device,
                                              .gpu = o.gpu,
                                              .deterministic = o.deterministic,
                                              .blas_threads = blas_threads},
                                             &backend_why));
  std::fprintf(o.out, "zo-train: computing with %s\n", backend_why.c_str());
  ZO_RETURN_IF_ERROR(ChooseGradientAccumulation(*backend, o, plan));
  std::unique_ptr<model::BatchSource> source;
  if (plan.text) {
    source = std::make_unique<TextBatchSource>(*plan.text, plan.micro_batch_size, o.gpt.block_size,
                                               plan.micro_batches, o.dp_rank, o.dp_world_size);
  } else {
    source = std::make_unique<MlpBatchSource>(o.mlp, o.seed, plan.micro_batch_size, o.dp_rank);
  }

  if (!o.restore.empty()) ZO_RETURN_IF_ERROR(RestoreJob(o, plan));
  ZO_ASSIGN_OR_RETURN(Attached at, AttachAtStart(o, plan, *backend, *source));
  const int64_t version = at.local.front().client->version();
  if (version >= o.steps) {
    std::fprintf(o.out,
                 "zo-train: job '%s' is at step %lld already (--steps %lld): nothing to do\n",
                 o.job.c_str(), static_cast<long long>(version), static_cast<long long>(o.steps));
    return absl::OkStatus();
  }
  if (version > 0) {
    std::fprintf(o.out, "zo-train: attached to job '%s' at version %lld; resuming at step %lld\n",
                 o.job.c_str(), static_cast<long long>(version),
                 static_cast<long long>(version + 1));
  }

  ZO_ASSIGN_OR_RETURN(
      Progress progress,
      Progress::Open(o.out, version + 1, o.steps, plan.config.steps_per_print, o.metrics_out));
  StepOutcomes outcomes;
  const bool checkpoints_here = at.local.front().stage == 0 && o.dp_rank == 0;
  CheckpointInFlight checkpoint;
  // Byte totals of the clients already closed (resend ones, a moved job's),
  // for metrics.
  OffloadClient::Traffic traffic_before;
  auto close_clients = [&](bool resend_only) {
    for (LocalStage& ls : at.local) {
      for (OffloadClient* c : {resend_only ? nullptr : ls.client.get(), ls.resend_client.get()}) {
        if (c == nullptr) continue;
        traffic_before.pushed_bytes += c->traffic().pushed_bytes;
        traffic_before.pulled_bytes += c->traffic().pulled_bytes;
      }
      if (resend_only) {
        ls.link->set_client(ls.client.get());
        ls.resend_client.reset();
      }
    }
  };
  // A step after a move may be one this worker already finished on the old
  // servers (its push was taken before the job was held): it runs again, the
  // same batch on the same weights, but is reported once.
  int64_t reported = version;
  TrainOptions moved_options = o;
  for (int64_t step = version + 1; step <= o.steps; ++step) {
    absl::StatusOr<StepReport> ran = RunStep(at.local, at.fabric.get(), step);
    absl::Status observed =
        ran.ok() ? ObserveJob(*at.local.front().client, outcomes).status() : absl::OkStatus();
    const absl::Status failed = !ran.ok() ? ran.status() : observed;
    std::optional<JobMove> move = ParseJobMove(failed);
    const bool lost_job = NoJobOn(failed, o.job);
    const bool unreachable = absl::IsUnavailable(failed) || absl::IsDeadlineExceeded(failed);
    // (Only where this process runs every stage: a pipeline stage in another
    // process may be what failed, and the error says which.)
    const bool all_stages_here = o.stage < 0 || o.pipeline_stages == 1;
    if (!move.has_value() && !moved_options.servers.empty() && all_stages_here &&
        JobWentOnWithout(failed)) {
      // Restarted after its last push of this step: the servers applied it
      // meanwhile (a push finds the chunk at a later step, or the version
      // this step computes on was replaced). Carry on from where they are.
      move = JobMove{.job = o.job, .servers = moved_options.servers, .version = step};
      progress.Note(absl::StrCat(
          "zo-train: the job went on past step ", step,
          " (this worker's gradients for it were all in): ", failed.message(), "; catching up"));
    } else if (!move.has_value() && !moved_options.servers.empty() && all_stages_here &&
               (lost_job || unreachable)) {
      // A server is down, or restarted without the job (its lead then rolls
      // every server back to the last checkpoint): wait for the job on the
      // same servers, at whatever version they are, and carry on from there.
      // At least version 1 once the job has trained: a job that came back
      // fresh at version 0 is not where this one is.
      move = JobMove{.job = o.job,
                     .servers = moved_options.servers,
                     .version = at.local.front().client->version() > 0 ? 1 : 0};
      progress.Note(absl::StrCat(
          "zo-train: ", failed.message(),
          lost_job ? "; waiting for the job to be rolled back" : "; waiting for the servers"));
    } else if (move.has_value()) {
      progress.Note(absl::StrCat("zo-train: job ", o.job, " moved to ",
                                 absl::StrJoin(move->servers, ","), " at version ", move->version,
                                 move->servers == moved_options.servers ? " (restored)" : "",
                                 "; following it"));
    }
    if (move.has_value()) {
      ZO_RETURN_IF_ERROR(CanFollow(o, *move));
      checkpoint.Wait(progress);  // it uses a client of the old placement
      close_clients(/*resend_only=*/false);
      at = Attached{};  // executors, modules, links and clients of the old placement
      moved_options.servers = move->servers;
      ZO_ASSIGN_OR_RETURN(at, Reattach(moved_options, plan, *backend, *source, *move, progress));
      step = at.local.front().client->version();  // the loop's ++ makes it the next step
      progress.Note(absl::StrCat("zo-train: job ", o.job, " is at version ", step, " on ",
                                 absl::StrJoin(moved_options.servers, ","), "; resuming at step ",
                                 step + 1));
      continue;
    }
    ZO_RETURN_IF_ERROR(failed);
    StepReport report = *std::move(ran);
    report.samples = int64_t{plan.micro_batches} * plan.micro_batch_size;
    if (plan.text) report.tokens = report.samples * o.gpt.block_size;
    if (o.metrics != nullptr && step > reported) {
      OffloadClient::Traffic t = traffic_before;
      for (const LocalStage& ls : at.local) {
        for (const OffloadClient* c : {ls.client.get(), ls.resend_client.get()}) {
          if (c == nullptr) continue;
          t.pushed_bytes += c->traffic().pushed_bytes;
          t.pulled_bytes += c->traffic().pulled_bytes;
        }
      }
      o.metrics->Record(report, t.pushed_bytes, t.pulled_bytes);
    }
    // The step the worker may have died in is done: back to strict pushes.
    if (at.local.front().resend_client) close_clients(/*resend_only=*/true);
    if (step > reported) {
      ZO_RETURN_IF_ERROR(progress.Step(report, outcomes));
      reported = step;
    }
    checkpoint.Poll(progress);
    if (checkpoints_here && o.checkpoint_every > 0 && step % o.checkpoint_every == 0) {
      checkpoint.Start(at.local.front().client.get(), step, progress);
    }
  }
  checkpoint.Wait(progress);
  // With DPU the servers finish the last step after the worker; wait for it
  // so every step's outcome is known.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (;;) {
    ZO_ASSIGN_OR_RETURN(int64_t now, ObserveJob(*at.local.front().client, outcomes));
    if (now >= o.steps || absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  ZO_RETURN_IF_ERROR(progress.Finish(outcomes));
  // Trained, but the job's newest checkpoint is older than asked: a run
  // that ends on a failed checkpoint does not exit 0.
  if (!checkpoint.last_failure().ok()) {
    return WithMessage(checkpoint.last_failure(),
                       absl::StrCat("training finished, but ", checkpoint.last_failure().message(),
                                    " (the job keeps its last committed checkpoint)"));
  }
  return absl::OkStatus();
}

}  // namespace zo::train
