#include "server/offload_service.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/host_port.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "rpc/job_move.h"
#include "rpc/rpc_util.h"
#include "server/job_spec.h"
#include "server/pull_reactor.h"
#include "server/push_reactor.h"

namespace zo {
namespace {

constexpr char kVersion[] = "0.1.0";

// The caller's deadline, or an hour for a call without one.
absl::Time DeadlineOf(const grpc::CallbackServerContext& context) {
  const absl::Time d = absl::FromChrono(context.deadline());
  return std::min(d, absl::Now() + absl::Hours(1));
}

// InitParams: each piece applied as it arrives (a copy into the job's master).
class InitParamsReactor final : public grpc::ServerReadReactor<v1::ParamInitPiece> {
 public:
  InitParamsReactor(JobRegistry* registry, const absl::Status& admitted,
                    v1::InitParamsResponse* response)
      : registry_(registry), response_(response) {
    if (!admitted.ok()) {
      Finish(ToGrpcStatus(admitted));
      return;
    }
    StartRead(&piece_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client is done writing, or the call is gone
      Finish(grpc::Status::OK);
      return;
    }
    if (absl::Status s = Apply(); !s.ok()) {
      Finish(ToGrpcStatus(s));
      return;
    }
    response_->set_pieces(response_->pieces() + 1);
    StartRead(&piece_);
  }
  void OnDone() override { delete this; }

 private:
  absl::Status Apply() {
    if (job_ == nullptr || job_->spec().name != piece_.job()) {
      ZO_ASSIGN_OR_RETURN(job_, registry_->Find(piece_.job()));
    }
    return job_->InitParams(piece_);
  }

  JobRegistry* const registry_;
  v1::InitParamsResponse* const response_;
  v1::ParamInitPiece piece_;
  std::shared_ptr<Job> job_;
};

}  // namespace

OffloadService::OffloadService(JobRegistry* registry, SharedRegions* regions,
                               std::string auth_token, int64_t max_message_bytes)
    : registry_(registry),
      regions_(regions),
      auth_(std::move(auth_token)),
      max_message_bytes_(max_message_bytes) {}

absl::Status OffloadService::Admit(const grpc::CallbackServerContext& context) const {
  return auth_.Check(context);
}

grpc::ServerUnaryReactor* OffloadService::Unary(grpc::CallbackServerContext* context,
                                                std::function<absl::Status()> handler) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = Admit(*context); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  handlers_.Run(
      [reactor, handler = std::move(handler)] { reactor->Finish(ToGrpcStatus(handler())); });
  return reactor;
}

grpc::ServerUnaryReactor* OffloadService::GetServerInfo(grpc::CallbackServerContext* context,
                                                        const v1::GetServerInfoRequest*,
                                                        v1::GetServerInfoResponse* response) {
  return Unary(context, [this, response] {
    response->set_version(kVersion);
    response->set_protocol_revision(kProtocolRevision);
    response->set_max_message_bytes(max_message_bytes_);
    for (const std::string& name : registry_->Names()) response->add_jobs(name);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* OffloadService::OpenJob(grpc::CallbackServerContext* context,
                                                  const v1::OpenJobRequest* request,
                                                  v1::OpenJobResponse* response) {
  return Unary(context, [this, context, request, response]() -> absl::Status {
    ZO_ASSIGN_OR_RETURN(JobSpec spec, JobSpecFromRequest(*request));
    ZO_ASSIGN_OR_RETURN(
        JobRegistry::Opened opened,
        registry_->Open(std::move(spec), request->attach_only(), request->by_lead()));
    response->set_attached(opened.attached);
    response->set_pull_stripes(true);
    *response->mutable_status() =
        opened.attached ? opened.job->StatusForAttach() : opened.job->Status();
    ZO_LOG(INFO) << (opened.attached ? "attached to job " : "opened job ") << request->job()
                 << " from " << context->peer();
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* OffloadService::GetJobStatus(grpc::CallbackServerContext* context,
                                                       const v1::GetJobStatusRequest* request,
                                                       v1::JobStatus* response) {
  return Unary(context, [this, request, response]() -> absl::Status {
    ZO_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, registry_->Find(request->job()));
    *response = job->Status();
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* OffloadService::CloseJob(grpc::CallbackServerContext* context,
                                                   const v1::CloseJobRequest* request,
                                                   v1::CloseJobResponse* response) {
  return Unary(context, [this, request, response]() -> absl::Status {
    std::optional<JobMove> moved;
    if (request->moved_to_size() > 0) {
      if (request->moved_version() < 0) {
        return absl::InvalidArgumentError("moved_version must be >= 0");
      }
      for (const std::string& server : request->moved_to()) {
        ZO_RETURN_IF_ERROR(ParseHostPort(server, PortUse::kConnect).status());
      }
      moved = JobMove{.job = request->job(),
                      .servers = {request->moved_to().begin(), request->moved_to().end()},
                      .version = request->moved_version()};
    }
    ZO_ASSIGN_OR_RETURN(*response,
                        registry_->Close(request->job(), request->delete_checkpoints(), moved));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* OffloadService::AdoptJob(grpc::CallbackServerContext* context,
                                                   const v1::AdoptJobRequest* request,
                                                   v1::AdoptJobResponse* response) {
  return Unary(context, [this, context, request, response]() -> absl::Status {
    if (request->checkpoint().empty() || request->servers().empty()) {
      return absl::InvalidArgumentError(
          "AdoptJob needs a checkpoint directory and the new servers");
    }
    ZO_ASSIGN_OR_RETURN(*response,
                        registry_->Adopt(request->checkpoint(),
                                         {request->servers().begin(), request->servers().end()},
                                         DeadlineOf(*context)));
    return absl::OkStatus();
  });
}

grpc::ServerReadReactor<v1::ParamInitPiece>* OffloadService::InitParams(
    grpc::CallbackServerContext* context, v1::InitParamsResponse* response) {
  return new InitParamsReactor(registry_, Admit(*context), response);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* OffloadService::PushGradients(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return new PushReactor(registry_, regions_, Admit(*context), response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* OffloadService::PullParams(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new PullReactor(registry_, regions_, Admit(*context), *request);
}

grpc::ServerUnaryReactor* OffloadService::ReportStepStats(grpc::CallbackServerContext* context,
                                                          const v1::StepStats* request,
                                                          v1::StepStatsResponse*) {
  return Unary(context, [this, request]() -> absl::Status {
    ZO_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, registry_->Find(request->job()));
    return job->OnStepStats(*request);
  });
}

grpc::ServerUnaryReactor* OffloadService::SetStepLr(grpc::CallbackServerContext* context,
                                                    const v1::StepLrRequest* request,
                                                    v1::StepLrResponse*) {
  return Unary(context, [this, request]() -> absl::Status {
    ZO_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, registry_->Find(request->job()));
    return job->OnStepLr(*request);
  });
}

grpc::ServerUnaryReactor* OffloadService::GetStepCompensation(
    grpc::CallbackServerContext* context, const v1::StepCompensationRequest* request,
    v1::StepCompensation* response) {
  return Unary(context, [this, context, request, response]() -> absl::Status {
    ZO_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, registry_->Find(request->job()));
    ZO_RETURN_IF_ERROR(job->CheckIncarnation(request->incarnation()));
    ZO_ASSIGN_OR_RETURN(*response, job->StepCompensation(request->step(), DeadlineOf(*context)));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* OffloadService::AttachRegion(grpc::CallbackServerContext* context,
                                                       const v1::AttachRegionRequest* request,
                                                       v1::AttachRegionResponse* response) {
  return Unary(context, [this, request, response]() -> absl::Status {
    // A region belongs to a job this server holds.
    ZO_RETURN_IF_ERROR(registry_->Find(request->job()).status());
    ZO_ASSIGN_OR_RETURN(const uint64_t region, regions_->Attach(*request));
    response->set_region(region);
    response->set_batched_ranges(true);  // GradientPiece.more_ranges (push_reactor.h)
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* OffloadService::CommitStep(grpc::CallbackServerContext* context,
                                                     const v1::StepCommit* request,
                                                     v1::StepCommitResponse*) {
  return Unary(context, [this, request]() -> absl::Status {
    ZO_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, registry_->Find(request->job()));
    return job->OnCommit(*request);
  });
}

grpc::ServerUnaryReactor* OffloadService::WriteCheckpointPart(
    grpc::CallbackServerContext* context, const v1::WriteCheckpointPartRequest* request,
    v1::WriteCheckpointPartResponse* response) {
  return Unary(context, [this, context, request, response]() -> absl::Status {
    ZO_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, registry_->Find(request->job()));
    ZO_ASSIGN_OR_RETURN(*response, job->WriteCheckpointPart(*request, DeadlineOf(*context)));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* OffloadService::RestorePart(grpc::CallbackServerContext* context,
                                                      const v1::RestorePartRequest* request,
                                                      v1::RestorePartResponse*) {
  return Unary(context, [this, request]() -> absl::Status {
    ZO_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, registry_->Find(request->job()));
    return job->RestorePart(*request);
  });
}

grpc::ServerUnaryReactor* OffloadService::Checkpoint(grpc::CallbackServerContext* context,
                                                     const v1::CheckpointRequest* request,
                                                     v1::CheckpointResponse* response) {
  return Unary(context, [this, context, request, response]() -> absl::Status {
    ZO_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, registry_->Find(request->job()));
    if (request->thaw()) {
      job->Thaw();
      return absl::OkStatus();
    }
    ZO_ASSIGN_OR_RETURN(*response, job->Checkpoint(request->min_version(), DeadlineOf(*context),
                                                   request->freeze()));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* OffloadService::Restore(grpc::CallbackServerContext* context,
                                                  const v1::RestoreRequest* request,
                                                  v1::RestoreResponse* response) {
  return Unary(context, [this, context, request, response]() -> absl::Status {
    ZO_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, registry_->Find(request->job()));
    ZO_ASSIGN_OR_RETURN(
        *response,
        job->Restore(request->path(), DeadlineOf(*context), request->rollback(),
                     request->has_if_restores() ? std::optional<int64_t>(request->if_restores())
                                                : std::nullopt));
    return absl::OkStatus();
  });
}

}  // namespace zo
