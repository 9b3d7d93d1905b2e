#include "worker/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/status_context.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "rpc/error_detail.h"
#include "rpc/job_move.h"
#include "worker/backend/select_backend.h"
#include "worker/client/follow_job.h"
#include "worker/client/offload_client.h"
#include "worker/data/char_dataset.h"
#include "worker/data/synthetic_source.h"
#include "worker/model/model_stage.h"
#include "worker/model/partition.h"
#include "worker/pipeline/executor.h"
#include "worker/pipeline/in_process_transport.h"
#include "worker/pipeline/schedule.h"
#include "worker/pipeline/tcp_transport.h"
#include "worker/train/batch_sources.h"
#include "worker/train/offload_link.h"
#include "worker/train/progress.h"
#include "worker/train/step_abort.h"
#include "worker/train/step_outcomes.h"
#include "worker/train/train_metrics.h"

namespace zo::train {
namespace {

// Bytes of synthetic text for a run without --data: plenty for a demo.
constexpr size_t kSyntheticBytes = size_t{1} << 20;

absl::Status CheckOptions(const TrainOptions& o) {
  if (o.model != "gpt" && o.model != "mlp") {
    return absl::InvalidArgumentError(
        absl::StrCat("--model must be gpt or mlp, not '", o.model, "'"));
  }
  if (o.pipeline_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pipeline-stages must be >= 1, got ", o.pipeline_stages));
  }
  if (o.restore_force && o.restore.empty()) {
    return absl::InvalidArgumentError("--restore-force needs --restore");
  }
  if (o.stage >= o.pipeline_stages) {
    return absl::InvalidArgumentError(absl::StrCat("--stage ", o.stage, " is outside the ",
                                                   o.pipeline_stages, " pipeline stages"));
  }
  if (o.stage >= 0 && o.pipeline_stages > 1) {
    if (static_cast<int>(o.stage_addresses.size()) != o.pipeline_stages) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stage needs --stage-addresses with one host:port per pipeline stage (",
                       o.pipeline_stages, "), got ", o.stage_addresses.size()));
    }
    if (o.servers.empty()) {
      return absl::InvalidArgumentError(
          "--stage runs one stage of a multi-process pipeline, whose processes must share "
          "offload servers: give --servers (the embedded server lives in one process)");
    }
  }
  if (o.steps < 1)
    return absl::InvalidArgumentError(absl::StrCat("--steps must be >= 1, got ", o.steps));
  if (o.checkpoint_every < 0) {
    return absl::InvalidArgumentError("--checkpoint-every must be >= 0");
  }
  if (o.activation_checkpoint_every < 0) {
    return absl::InvalidArgumentError("--activation-checkpoint-every must be >= 0");
  }
  if (o.schedule != "gpipe" && o.schedule != "1f1b" && o.schedule != "interleaved") {
    return absl::InvalidArgumentError(
        absl::StrCat("--schedule must be gpipe, 1f1b or interleaved, not '", o.schedule, "'"));
  }
  if (o.schedule != "interleaved" && o.virtual_chunks != 1) {
    return absl::InvalidArgumentError("--virtual-chunks needs --schedule interleaved");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<pipeline::StageProgram>> Programs(const TrainOptions& o,
                                                             int micro_batches) {
  if (o.schedule == "gpipe") return pipeline::GPipeSchedule(o.pipeline_stages, micro_batches);
  if (o.schedule == "1f1b") return pipeline::OneFOneBSchedule(o.pipeline_stages, micro_batches);
  return pipeline::InterleavedOneFOneBSchedule(o.pipeline_stages, micro_batches, o.virtual_chunks);
}

// One stage of this process: its client(s), link, module and executor.
struct LocalStage {
  int stage = 0;
  std::unique_ptr<OffloadClient> client;
  std::unique_ptr<OffloadClient> resend_client;  // the first step after a restart
  std::unique_ptr<OffloadLink> link;
  std::unique_ptr<model::ModelStage> module;
  std::unique_ptr<pipeline::Executor> executor;
};

// What the options and config make of the run, before anything connects.
struct Plan {
  Config config;
  DType dtype = DType::kFloat32;
  int micro_batches = 1;
  int micro_batch_size = 1;
  std::optional<CharDataset> text;  // GPT-lite's data
  model::Model model;
  std::vector<int> bounds;  // virtual stage v holds layers [bounds[v], bounds[v + 1])
  std::vector<pipeline::StageProgram> programs;
};

absl::StatusOr<Plan> MakePlan(const TrainOptions& o) {
  Plan plan;
  ZO_ASSIGN_OR_RETURN(LoadedConfig loaded,
                      ParseConfig(o.config_json, {.dp_world_size = o.dp_world_size}));
  plan.config = loaded.config;
  plan.dtype = plan.config.fp16.enabled   ? DType::kFloat16
               : plan.config.bf16.enabled ? DType::kBFloat16
                                          : DType::kFloat32;
  plan.micro_batches = static_cast<int>(plan.config.gradient_accumulation_steps);
  plan.micro_batch_size = static_cast<int>(plan.config.train_micro_batch_size_per_gpu);
  if (o.model == "gpt") {
    if (o.data_path.empty()) {
      ZO_ASSIGN_OR_RETURN(plan.text,
                          CharDataset::FromText(SyntheticText(kSyntheticBytes, o.seed), o.seed));
    } else {
      ZO_ASSIGN_OR_RETURN(plan.text, CharDataset::FromFile(o.data_path, o.seed));
    }
    model::GptConfig gpt = o.gpt;
    gpt.vocab = plan.text->vocab().size();
    ZO_ASSIGN_OR_RETURN(plan.model, model::MakeGpt(gpt));
  } else {
    ZO_ASSIGN_OR_RETURN(plan.model, model::MakeMlp(o.mlp, plan.dtype));
  }
  std::vector<model::LayerWeightInfo> infos;
  for (const auto& layer : plan.model.layers) {
    infos.push_back({layer->type(), layer->param_count()});
  }
  ZO_ASSIGN_OR_RETURN(
      plan.bounds,
      model::PartitionLayers(infos, o.pipeline_stages * o.virtual_chunks, o.partition_method));
  ZO_ASSIGN_OR_RETURN(plan.programs, Programs(o, plan.micro_batches));
  return plan;
}

void PrintPlan(const TrainOptions& o, const Plan& plan) {
  std::fprintf(o.out, "zo-train: %s\n", plan.model.Describe().c_str());
  const std::string servers = o.servers.empty()
                                  ? "embedded offload server"
                                  : absl::StrCat(o.servers.size(), " offload server(s)");
  std::fprintf(o.out,
               "zo-train: %s, %d micro-batches of %d per step, %d pipeline stage%s (%s, %s), "
               "%s\n",
               std::string(DTypeName(plan.dtype)).c_str(), plan.micro_batches,
               plan.micro_batch_size, o.pipeline_stages, o.pipeline_stages == 1 ? "" : "s",
               o.schedule.c_str(), o.partition_method.c_str(), servers.c_str());
  for (int v = 0; v + 1 < static_cast<int>(plan.bounds.size()); ++v) {
    int64_t params = 0;
    for (int j = plan.bounds[v]; j < plan.bounds[v + 1]; ++j) {
      params += plan.model.layers[j]->param_count();
    }
    const std::string chunk =
        o.virtual_chunks > 1 ? absl::StrCat(" chunk ", v / o.pipeline_stages) : "";
    std::fprintf(
        o.out, "zo-train:   stage %d%s: layers %s .. %s (%lld parameters)\n", v % o.pipeline_stages,
        chunk.c_str(), plan.model.layers[plan.bounds[v]]->name().c_str(),
        plan.model.layers[plan.bounds[v + 1] - 1]->name().c_str(), static_cast<long long>(params));
  }
  if (plan.config.zo.dpu.enabled) {
    std::fprintf(o.out,
                 "zo-train: DPU on after step %d: each step computes its gradients on weights one "
                 "step stale, so the servers' optimizer step overlaps the next forward/backward. "
                 "It pays when the compute step takes about as long as the server step; staleness "
                 "can slow the loss's descent, most while it falls steeply.\n",
                 plan.config.zo.dpu.warmup_steps);
  }
  std::fflush(o.out);  // before the servers are reached, which may take a while
}

// Opens stage `stage`'s client (and, for a job that has trained, a resend
// client for the step this worker may have died in), link and module.
ClientOptions MakeClientOptions(const TrainOptions& o) {
  ClientOptions options;
  options.job = o.job;
  options.servers = o.servers;
  options.channels = o.channels;
  options.routes = o.routes;
  options.auth_token = o.auth_token;
  options.tls_root_certs = o.tls_root_certs;
  options.dp_rank = o.dp_rank;
  options.dp_world_size = o.dp_world_size;
  return options;
}

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

absl::StatusOr<LocalStage> OpenStage(const TrainOptions& o, Plan& plan, backend::Backend& backend,
                                     model::BatchSource& source, int stage, bool attach_only) {
  const std::vector<TensorSpec> manifest = plan.model.Manifest(plan.dtype);
  ClientOptions options = MakeClientOptions(o);
  options.attach_only = attach_only;
  LocalStage ls;
  ls.stage = stage;
  ZO_ASSIGN_OR_RETURN(ls.client, OffloadClient::Open(options, o.config_json, manifest));
  if (ls.client->version() > 0) {
    // The servers may hold part of step version + 1 from this rank.
    options.resend = true;
    ZO_ASSIGN_OR_RETURN(ls.resend_client, OffloadClient::Open(options, o.config_json, manifest));
  }
  ls.link = std::make_unique<OffloadLink>(
      ls.resend_client ? ls.resend_client.get() : ls.client.get(), backend, manifest, plan.dtype);
  const model::StageOptions stage_options{
      .stage = stage,
      .stages = o.pipeline_stages,
      .chunks = o.virtual_chunks,
      .micro_batches = plan.micro_batches,
      .dtype = plan.dtype,
      .checkpoint_every = o.activation_checkpoint_every,
      .push_every_micro_batch =
          plan.config.zo.gradient_accumulation == GradientAccumulation::kServers};
  ZO_ASSIGN_OR_RETURN(ls.module, model::ModelStage::Create(backend, plan.model, plan.bounds,
                                                           stage_options, source, *ls.link));
  ZO_RETURN_IF_ERROR(ls.link->InitializeIfFresh(ls.module->params(), o.seed));
  return ls;
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

absl::StatusOr<int64_t> ObserveJob(OffloadClient& client, StepOutcomes& outcomes) {
  ZO_ASSIGN_OR_RETURN(v1::JobStatus status, client.JobStatus());
  outcomes.Observe(status.version(), status.applied_steps(), status.last_skipped(),
                   status.last_grad_norm(), status.last_lr());
  return status.version();
}

}  // namespace

// The stages this process runs, attached to the job, with their transport.
// Destroyed in reverse: executors before modules before links before clients.
struct Attached {
  std::unique_ptr<pipeline::InProcessFabric> fabric;
  std::unique_ptr<pipeline::TcpTransport> tcp;
  std::vector<LocalStage> local;
};

absl::StatusOr<Attached> Attach(const TrainOptions& o, Plan& plan, backend::Backend& backend,
                                model::BatchSource& source, bool attach_only) {
  Attached at;
  // One client per local stage: each pulls and pushes only its own tensors.
  for (int s = 0; s < o.pipeline_stages; ++s) {
    if (o.stage >= 0 && s != o.stage) continue;
    ZO_ASSIGN_OR_RETURN(LocalStage ls, OpenStage(o, plan, backend, source, s, attach_only));
    at.local.push_back(std::move(ls));
  }
  // Transport: threads of this process, or TCP to the other stages' processes.
  if (o.stage < 0 || o.pipeline_stages == 1) {
    at.fabric = std::make_unique<pipeline::InProcessFabric>(o.pipeline_stages);
  } else {
    std::fprintf(o.out, "zo-train: connecting to the other pipeline stages (%s)\n",
                 absl::StrJoin(o.stage_addresses, ", ").c_str());
    std::fflush(o.out);  // the other stages may take a while to come up
    // A neighbour that dies leaves this stage's prefetch waiting for a
    // version the servers cannot reach without it: cancel it, and fail the
    // step saying why.
    auto abort = std::make_shared<StepAbort>();
    for (LocalStage& ls : at.local) ls.link->set_step_abort(abort);
    const auto neighbour_lost = [abort](int stage, const absl::Status& why) {
      abort->Trip(absl::UnavailableError(
          absl::StrCat("pipeline stage ", stage, " is gone: ", why.message())));
    };
    ZO_ASSIGN_OR_RETURN(at.tcp, pipeline::TcpTransport::Connect({.stage = o.stage,
                                                                 .stages = o.pipeline_stages,
                                                                 .addresses = o.stage_addresses,
                                                                 .job = o.job,
                                                                 .on_peer_lost = neighbour_lost},
                                                                backend));
    const std::set<int> neighbours = {(o.stage + o.pipeline_stages - 1) % o.pipeline_stages,
                                      (o.stage + 1) % o.pipeline_stages};
    for (int n : neighbours) {
      std::fprintf(o.out, "zo-train: stage %d <-> stage %d: tensors through %s\n", o.stage, n,
                   at.tcp->Route(n).c_str());
    }
  }
  for (LocalStage& ls : at.local) {
    pipeline::Transport& transport =
        at.fabric ? at.fabric->ForStage(ls.stage) : static_cast<pipeline::Transport&>(*at.tcp);
    ls.executor =
        std::make_unique<pipeline::Executor>(ls.stage, o.pipeline_stages, o.virtual_chunks,
                                             plan.programs[ls.stage], *ls.module, transport);
  }
  return at;
}

// The first attach. Servers that cannot be reached yet (a host restarting,
// a Kubernetes pod not ready, a lead killed a moment ago) are waited for,
// saying so at once and every 10 s, for at most 5 minutes; any other error
// ends it.
absl::StatusOr<Attached> AttachAtStart(const TrainOptions& o, Plan& plan, backend::Backend& backend,
                                       model::BatchSource& source) {
  const absl::Time start = absl::Now();
  absl::Time next_note = start;
  for (;;) {
    absl::StatusOr<Attached> at = Attach(o, plan, backend, source, /*attach_only=*/false);
    const absl::Status why = at.status();
    if (at.ok() || o.servers.empty() ||
        !(absl::IsUnavailable(why) || absl::IsDeadlineExceeded(why))) {
      return at;
    }
    if (absl::Now() - start > absl::Minutes(5)) {
      return WithContext(why, absl::StrCat("the servers of job ", o.job,
                                           " were still unreachable after 5 minutes"));
    }
    if (absl::Now() >= next_note) {
      std::fprintf(o.out, "zo-train: waiting for the servers (%s), %lld s (%s)\n",
                   absl::StrJoin(o.servers, ",").c_str(),
                   static_cast<long long>(absl::ToInt64Seconds(absl::Now() - start)),
                   std::string(why.message()).c_str());
      std::fflush(o.out);
      next_note = absl::Now() + absl::Seconds(10);
    }
    absl::SleepFor(absl::Milliseconds(500));
  }
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

// Opens the job on its servers (the restarted lead creates it empty) and
// restores the latest checkpoint on all of them.
absl::Status RestoreAfterLeadLoss(const TrainOptions& o, const Plan& plan) {
  ZO_ASSIGN_OR_RETURN(
      std::unique_ptr<OffloadClient> client,
      OffloadClient::Open(MakeClientOptions(o), o.config_json, plan.model.Manifest(plan.dtype)));
  if (client->CheckState().ok() && client->version() > 0) {
    return absl::OkStatus();  // someone restored it already
  }
  // Also when every server came back empty: training goes on from the
  // latest checkpoint, never silently from version 0.
  return client->Restore("", /*rollback=*/true).status();
}

// A checkpoint asked of the lead while training goes on: the servers take it
// at its version and write it during the next steps, so the worker does not
// wait for it either. One at a time; its outcome is printed once known. A
// checkpoint that fails (a server lost while writing its part) ends nothing:
// the job keeps its last committed one, and the next step finds out what
// happened to the servers.
class CheckpointInFlight {
 public:
  // Waits for the one before, if any.
  void Start(OffloadClient* client, int64_t step, Progress& progress) {
    Wait(progress);
    step_ = step;
    result_ = std::async(std::launch::async, [client, step] { return client->Checkpoint(step); });
  }
  void Poll(Progress& progress) {
    if (result_.valid() && result_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      Report(progress);
    }
  }
  void Wait(Progress& progress) {
    if (result_.valid()) Report(progress);
  }
  // The last checkpoint's failure, OK once one succeeds: zo-train exits
  // non-zero when training ends on a failed checkpoint.
  const absl::Status& last_failure() const { return last_failure_; }

 private:
  void Report(Progress& progress) {
    const absl::StatusOr<std::string> path = result_.get();
    progress.Note(path.ok() ? absl::StrCat("zo-train: checkpoint written: ", *path)
                            : absl::StrCat("zo-train: checkpoint of step ", step_,
                                           " failed, training goes on: ", path.status().message()));
    last_failure_ =
        path.ok()
            ? absl::OkStatus()
            : WithContext(path.status(), absl::StrCat("the checkpoint of step ", step_, " failed"));
  }

  int64_t step_ = 0;
  absl::Status last_failure_;
  std::future<absl::StatusOr<std::string>> result_;
};

// The servers applied a step this worker is still computing: it restarted
// after its last push of that step. Its pull then finds the version the step
// computes on replaced, or its push finds the chunk taking a later step.
bool JobWentOnWithout(const absl::Status& failed) {
  const v1::ErrorDetail::Reason why = ReasonOf(failed);
  return why == v1::ErrorDetail::VERSION_NOT_HELD || why == v1::ErrorDetail::STEP_NOT_OPEN;
}

// A server said it does not hold job `job`; `server`: that server only.
bool NoJobOn(const absl::Status& failed, const std::string& job, const std::string& server = "") {
  const std::optional<v1::ErrorDetail> detail = DetailOf(failed);
  return detail.has_value() && detail->reason() == v1::ErrorDetail::NO_JOB &&
         detail->job() == job && (server.empty() || detail->server() == server);
}

// Attaches to a job that moved, once it is there at the version the move
// named (FollowJob).
absl::StatusOr<Attached> Reattach(const TrainOptions& o, Plan& plan, backend::Backend& backend,
                                  model::BatchSource& source, const JobMove& move,
                                  Progress& progress) {
  std::optional<Attached> attached;
  const absl::Status followed = FollowJob(
      move,
      [&]() -> absl::Status {
        ZO_ASSIGN_OR_RETURN(Attached at, Attach(o, plan, backend, source, /*attach_only=*/true));
        ZO_RETURN_IF_ERROR(CheckArrived(*at.local.front().client, move));
        attached = std::move(at);
        return absl::OkStatus();
      },
      {.note =
           [&](absl::Duration waited, const absl::Status& why) {
             progress.Note(absl::StrCat("zo-train: waiting for job ", o.job, " on ",
                                        absl::StrJoin(move.servers, ","), ", ",
                                        absl::ToInt64Seconds(waited), " s (", why.message(), ")"));
           },
       .retrying =
           [&](absl::Duration waited, const absl::Status& why) {
             // The lead restarted without the job while the others kept it:
             // nothing on the servers can roll it back, so one worker (dp
             // rank 0 with stage 0) opens it there again and restores its
             // latest checkpoint.
             if (o.dp_rank != 0 || o.stage > 0 || o.servers.empty() ||
                 !NoJobOn(why, o.job, o.servers[0]) || waited <= absl::Seconds(2)) {
               return;
             }
             const absl::Status restored = RestoreAfterLeadLoss(o, plan);
             progress.Note(restored.ok()
                               ? absl::StrCat("zo-train: the lead ", o.servers[0],
                                              " restarted without job ", o.job,
                                              "; restored it from its latest checkpoint")
                               : absl::StrCat("zo-train: restoring job ", o.job, " on ",
                                              o.servers[0], " failed: ", restored.message()));
           }});
  if (!followed.ok()) return followed;
  return std::move(*attached);
}

// Settles zo.gradient_accumulation for this process's stages ("auto":
// device when their weights, twice for the prefetch, and fp32 gradients take
// at most half the device's free memory), says so, and puts the choice in
// the config the job is opened with.
absl::Status ChooseGradientAccumulation(const backend::Backend& backend, TrainOptions& o,
                                        Plan& plan) {
  GradientAccumulation& policy = plan.config.zo.gradient_accumulation;
  const int64_t micro = plan.config.gradient_accumulation_steps;
  std::string why = "zo.gradient_accumulation";
  if (policy == GradientAccumulation::kAuto) {
    int64_t params = 0;
    for (int v = 0; v + 1 < static_cast<int>(plan.bounds.size()); ++v) {
      if (o.stage >= 0 && v % o.pipeline_stages != o.stage) continue;
      for (int j = plan.bounds[v]; j < plan.bounds[v + 1]; ++j) {
        params += plan.model.layers[j]->param_count();
      }
    }
    const int64_t device_bytes = params * (2 * static_cast<int64_t>(DTypeSize(plan.dtype)) + 4);
    const std::optional<int64_t> free = backend.FreeDeviceMemory();
    policy = !free.has_value() || device_bytes <= *free / 2 ? GradientAccumulation::kDevice
                                                            : GradientAccumulation::kServers;
    why = free.has_value()
              ? absl::StrCat("auto: weights x2 and fp32 gradients need ", FormatBytes(device_bytes),
                             policy == GradientAccumulation::kDevice ? ", at most" : ", more than",
                             " half the ", FormatBytes(*free), " free on ", backend.name())
              : "auto: host memory";
  }
  if (policy == GradientAccumulation::kServers) {
    std::fprintf(o.out,
                 "zo-train: gradients summed on the servers (%s): each of the %lld micro-batches "
                 "pushes its own, no gradient tensors kept here\n",
                 why.c_str(), static_cast<long long>(micro));
  } else if (micro > 1) {
    std::fprintf(o.out, "zo-train: gradients summed here over %lld micro-batches (%s)\n",
                 static_cast<long long>(micro), why.c_str());
  }
  ZO_ASSIGN_OR_RETURN(o.config_json, WithGradientAccumulation(o.config_json, policy));
  return absl::OkStatus();
}

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
