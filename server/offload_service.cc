#include "server/offload_service.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/host_port.h"
#include "common/logging.h"
#include "rpc/job_move.h"
#include "rpc/rpc_util.h"
#include "server/job_spec.h"
#include "server/pull_reactor.h"
#include "server/push_reactor.h"

namespace zo {
namespace {

constexpr char kVersion[] = "0.1.0";

// The caller's deadline, or an hour for a call without one.
absl::Time DeadlineOf(const grpc::ServerContext& context) {
  const absl::Time d = absl::FromChrono(context.deadline());
  return std::min(d, absl::Now() + absl::Hours(1));
}

#define ZO_RPC_AUTH(context)                                                       \
  do {                                                                             \
    if (absl::Status s = auth_.Check(*(context)); !s.ok()) return ToGrpcStatus(s); \
  } while (0)

#define ZO_RPC_ASSIGN_OR_RETURN(lhs, expr)                    \
  auto lhs##_or = (expr);                                     \
  if (!lhs##_or.ok()) return ToGrpcStatus(lhs##_or.status()); \
  auto lhs = *std::move(lhs##_or)

}  // namespace

OffloadService::OffloadService(JobRegistry* registry, SharedRegions* regions,
                               std::string auth_token, int64_t max_message_bytes)
    : registry_(registry),
      regions_(regions),
      auth_(std::move(auth_token)),
      max_message_bytes_(max_message_bytes) {}

grpc::Status OffloadService::GetServerInfo(grpc::ServerContext* context,
                                           const v1::GetServerInfoRequest*,
                                           v1::GetServerInfoResponse* response) {
  ZO_RPC_AUTH(context);
  response->set_version(kVersion);
  response->set_protocol_revision(kProtocolRevision);
  response->set_max_message_bytes(max_message_bytes_);
  for (const std::string& name : registry_->Names()) response->add_jobs(name);
  return grpc::Status::OK;
}

grpc::Status OffloadService::OpenJob(grpc::ServerContext* context,
                                     const v1::OpenJobRequest* request,
                                     v1::OpenJobResponse* response) {
  ZO_RPC_AUTH(context);
  ZO_RPC_ASSIGN_OR_RETURN(spec, JobSpecFromRequest(*request));
  ZO_RPC_ASSIGN_OR_RETURN(opened, registry_->Open(std::move(spec), request->attach_only()));
  response->set_attached(opened.attached);
  *response->mutable_status() =
      opened.attached ? opened.job->StatusForAttach() : opened.job->Status();
  ZO_LOG(INFO) << (opened.attached ? "attached to job " : "opened job ") << request->job()
               << " from " << context->peer();
  return grpc::Status::OK;
}

grpc::Status OffloadService::GetJobStatus(grpc::ServerContext* context,
                                          const v1::GetJobStatusRequest* request,
                                          v1::JobStatus* response) {
  ZO_RPC_AUTH(context);
  ZO_RPC_ASSIGN_OR_RETURN(job, registry_->Find(request->job()));
  *response = job->Status();
  return grpc::Status::OK;
}

grpc::Status OffloadService::CloseJob(grpc::ServerContext* context,
                                      const v1::CloseJobRequest* request,
                                      v1::CloseJobResponse* response) {
  ZO_RPC_AUTH(context);
  std::optional<JobMove> moved;
  if (request->moved_to_size() > 0) {
    if (request->moved_version() < 0) {
      return ToGrpcStatus(absl::InvalidArgumentError("moved_version must be >= 0"));
    }
    for (const std::string& server : request->moved_to()) {
      ZO_RPC_ASSIGN_OR_RETURN(parsed, ParseHostPort(server, PortUse::kConnect));
      (void)parsed;
    }
    moved = JobMove{.job = request->job(),
                    .servers = {request->moved_to().begin(), request->moved_to().end()},
                    .version = request->moved_version()};
  }
  ZO_RPC_ASSIGN_OR_RETURN(closed,
                          registry_->Close(request->job(), request->delete_checkpoints(), moved));
  *response = std::move(closed);
  return grpc::Status::OK;
}

grpc::Status OffloadService::AdoptJob(grpc::ServerContext* context,
                                      const v1::AdoptJobRequest* request,
                                      v1::AdoptJobResponse* response) {
  ZO_RPC_AUTH(context);
  if (request->checkpoint().empty() || request->servers().empty()) {
    return ToGrpcStatus(
        absl::InvalidArgumentError("AdoptJob needs a checkpoint directory and the new servers"));
  }
  ZO_RPC_ASSIGN_OR_RETURN(adopted,
                          registry_->Adopt(request->checkpoint(),
                                           {request->servers().begin(), request->servers().end()},
                                           DeadlineOf(*context)));
  *response = std::move(adopted);
  return grpc::Status::OK;
}

grpc::Status OffloadService::InitParams(grpc::ServerContext* context,
                                        grpc::ServerReader<v1::ParamInitPiece>* reader,
                                        v1::InitParamsResponse* response) {
  ZO_RPC_AUTH(context);
  v1::ParamInitPiece piece;
  std::shared_ptr<Job> job;
  while (reader->Read(&piece)) {
    if (job == nullptr || job->spec().name != piece.job()) {
      ZO_RPC_ASSIGN_OR_RETURN(found, registry_->Find(piece.job()));
      job = std::move(found);
    }
    if (absl::Status s = job->InitParams(piece); !s.ok()) return ToGrpcStatus(s);
    response->set_pieces(response->pieces() + 1);
  }
  return grpc::Status::OK;
}

grpc::ServerReadReactor<grpc::ByteBuffer>* OffloadService::PushGradients(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return new PushReactor(registry_, regions_, auth_, *context, response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* OffloadService::PullParams(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new PullReactor(registry_, regions_, auth_, *context, *request);
}

grpc::Status OffloadService::ReportStepStats(grpc::ServerContext* context,
                                             const v1::StepStats* request, v1::StepStatsResponse*) {
  ZO_RPC_AUTH(context);
  ZO_RPC_ASSIGN_OR_RETURN(job, registry_->Find(request->job()));
  return ToGrpcStatus(job->OnStepStats(*request));
}

grpc::Status OffloadService::SetStepLr(grpc::ServerContext* context,
                                       const v1::StepLrRequest* request, v1::StepLrResponse*) {
  ZO_RPC_AUTH(context);
  ZO_RPC_ASSIGN_OR_RETURN(job, registry_->Find(request->job()));
  if (absl::Status s = job->CheckIncarnation(request->incarnation()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return ToGrpcStatus(job->OnStepLr(*request));
}

grpc::Status OffloadService::AttachRegion(grpc::ServerContext* context,
                                          const v1::AttachRegionRequest* request,
                                          v1::AttachRegionResponse* response) {
  ZO_RPC_AUTH(context);
  ZO_RPC_ASSIGN_OR_RETURN(job, registry_->Find(request->job()));
  (void)job;  // a region belongs to a job this server holds
  ZO_RPC_ASSIGN_OR_RETURN(region, regions_->Attach(*request));
  response->set_region(region);
  return grpc::Status::OK;
}

grpc::Status OffloadService::CommitStep(grpc::ServerContext* context, const v1::StepCommit* request,
                                        v1::StepCommitResponse*) {
  ZO_RPC_AUTH(context);
  ZO_RPC_ASSIGN_OR_RETURN(job, registry_->Find(request->job()));
  return ToGrpcStatus(job->OnCommit(*request));
}

grpc::Status OffloadService::WriteCheckpointPart(grpc::ServerContext* context,
                                                 const v1::WriteCheckpointPartRequest* request,
                                                 v1::WriteCheckpointPartResponse* response) {
  ZO_RPC_AUTH(context);
  ZO_RPC_ASSIGN_OR_RETURN(job, registry_->Find(request->job()));
  ZO_RPC_ASSIGN_OR_RETURN(part, job->WriteCheckpointPart(*request, DeadlineOf(*context)));
  *response = std::move(part);
  return grpc::Status::OK;
}

grpc::Status OffloadService::RestorePart(grpc::ServerContext* context,
                                         const v1::RestorePartRequest* request,
                                         v1::RestorePartResponse*) {
  ZO_RPC_AUTH(context);
  ZO_RPC_ASSIGN_OR_RETURN(job, registry_->Find(request->job()));
  return ToGrpcStatus(job->RestorePart(*request));
}

grpc::Status OffloadService::Checkpoint(grpc::ServerContext* context,
                                        const v1::CheckpointRequest* request,
                                        v1::CheckpointResponse* response) {
  ZO_RPC_AUTH(context);
  ZO_RPC_ASSIGN_OR_RETURN(job, registry_->Find(request->job()));
  if (request->thaw()) {
    job->Thaw();
    return grpc::Status::OK;
  }
  ZO_RPC_ASSIGN_OR_RETURN(
      result, job->Checkpoint(request->min_version(), DeadlineOf(*context), request->freeze()));
  *response = std::move(result);
  return grpc::Status::OK;
}

grpc::Status OffloadService::Restore(grpc::ServerContext* context,
                                     const v1::RestoreRequest* request,
                                     v1::RestoreResponse* response) {
  ZO_RPC_AUTH(context);
  ZO_RPC_ASSIGN_OR_RETURN(job, registry_->Find(request->job()));
  ZO_RPC_ASSIGN_OR_RETURN(result,
                          job->Restore(request->path(), DeadlineOf(*context), request->rollback()));
  *response = std::move(result);
  return grpc::Status::OK;
}

}  // namespace zo
