#include "worker/train/attach.h"

#include <chrono>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_context.h"
#include "common/status_macros.h"
#include "offload/io/io_engine.h"
#include "rpc/error_detail.h"
#include "worker/client/follow_job.h"
#include "worker/train/step_abort.h"

namespace zo::train {
namespace {

// Opens stage `stage`'s client (and, for a job that has trained, a resend
// client for the step this worker may have died in), link and module.
absl::StatusOr<LocalStage> OpenStage(const TrainOptions& o, Plan& plan, backend::Backend& backend,
                                     model::BatchSource& source, int stage, bool attach_only) {
  const std::vector<TensorSpec> manifest = plan.model.Manifest(plan.dtype);
  ClientOptions options = MakeClientOptions(o);
  options.attach_only = attach_only;
  // Both callers (AttachAtStart, Reattach's FollowJob) try again
  // themselves, at their own pace (ClientOptions::open_retry_for).
  options.open_retry_for = absl::Seconds(1);
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
  if (plan.config.zo.dpu.compensation == DpuCompensation::kWorker) {
    ls.link->CompensateDelayedSteps();
  }
  const OffloadParamConfig& offload_param = plan.config.zero_optimization.offload_param;
  if (plan.streams() && offload_param.device == OffloadDevice::kNvme) {
    ls.link->KeepStreamedWeightsInFile({.dir = offload_param.nvme_path,
                                        .io = IoEngineOptionsFromConfig(plan.config.aio),
                                        .buffer_elems = offload_param.buffer_size});
  }
  const std::vector<std::string> routes = ls.client->routes();
  if (!plan.streams()) {
    std::fprintf(o.out, "zo-train: stage %d keeps its weights on the device (routes: %s)\n", stage,
                 absl::StrJoin(routes, ", ").c_str());
  } else {
    const StreamedWeights::Kind kind = ls.link->streamed_kind();
    std::fprintf(o.out, "zo-train: stage %d streams its weights %s (routes: %s)\n", stage,
                 kind == StreamedWeights::Kind::kFile
                     ? "from a file on NVMe, pulled into it once a step"
                 : kind == StreamedWeights::Kind::kServers
                     ? "from the servers' own copy, a layer at a time (no copy of its own)"
                     : "from a host copy of its own, pulled once a step",
                 absl::StrJoin(routes, ", ").c_str());
  }
  ZO_ASSIGN_OR_RETURN(ls.module,
                      model::ModelStage::Create(backend, plan.model, plan.bounds,
                                                StageOptionsFor(o, plan, stage), source, *ls.link));
  ZO_RETURN_IF_ERROR(ls.link->InitializeIfFresh(ls.module->params(), o.seed));
  return ls;
}

// Opens this process's stages and the transport between them.
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

}  // namespace

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
  options.applies_dpu_compensation = true;  // OffloadLink::CompensateDelayedSteps
  return options;
}

absl::StatusOr<Attached> AttachAtStart(const TrainOptions& o, Plan& plan, backend::Backend& backend,
                                       model::BatchSource& source) {
  // Time waited on a monotonic clock, as FollowJob's: a stepped wall clock
  // must not end the wait early.
  const auto start = std::chrono::steady_clock::now();
  absl::Duration next_note;
  for (;;) {
    absl::StatusOr<Attached> at = Attach(o, plan, backend, source, /*attach_only=*/false);
    const absl::Status why = at.status();
    if (at.ok() || o.servers.empty() ||
        !(absl::IsUnavailable(why) || absl::IsDeadlineExceeded(why))) {
      return at;
    }
    const absl::Duration waited = absl::FromChrono(std::chrono::steady_clock::now() - start);
    if (waited > absl::Minutes(5)) {
      return WithContext(why, absl::StrCat("the servers of job ", o.job,
                                           " were still unreachable after 5 minutes"));
    }
    if (waited >= next_note) {
      std::fprintf(o.out, "zo-train: waiting for the servers (%s), %lld s (%s)\n",
                   absl::StrJoin(o.servers, ",").c_str(),
                   static_cast<long long>(absl::ToInt64Seconds(waited)),
                   std::string(why.message()).c_str());
      std::fflush(o.out);
      next_note = waited + absl::Seconds(10);
    }
    absl::SleepFor(absl::Milliseconds(500));
  }
}

bool NoJobOn(const absl::Status& failed, const std::string& job, const std::string& server) {
  const std::optional<v1::ErrorDetail> detail = DetailOf(failed);
  return detail.has_value() && detail->reason() == v1::ErrorDetail::NO_JOB &&
         detail->job() == job && (server.empty() || detail->server() == server);
}

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

}  // namespace zo::train
