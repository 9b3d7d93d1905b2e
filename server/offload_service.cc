#include "server/offload_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "grpcpp/support/method_handler.h"
#include "rpc/rpc_util.h"
#include "server/gradient_piece_view.h"
#include "server/job_spec.h"

namespace zo {
namespace {

constexpr char kVersion[] = "0.1.0";

// The caller's deadline, or an hour for a call without one.
absl::Time DeadlineOf(const grpc::ServerContext& context) {
  const absl::Time d = absl::FromChrono(context.deadline());
  return std::min(d, absl::Now() + absl::Hours(1));
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

#define ZO_RPC_AUTH(context)                                                     \
  do {                                                                           \
    if (absl::Status s = CheckAuth(*(context)); !s.ok()) return ToGrpcStatus(s); \
  } while (0)

#define ZO_RPC_ASSIGN_OR_RETURN(lhs, expr)                    \
  auto lhs##_or = (expr);                                     \
  if (!lhs##_or.ok()) return ToGrpcStatus(lhs##_or.status()); \
  auto lhs = *std::move(lhs##_or)

}  // namespace

OffloadService::OffloadService(JobRegistry* registry, std::string auth_token,
                               int64_t max_message_bytes)
    : registry_(registry),
      auth_token_(std::move(auth_token)),
      max_message_bytes_(max_message_bytes) {
  // Method 5 of zo.v1.Offload is PushGradients (checked by a test that
  // pushes through the real service).
  MarkMethodStreamed(
      5, new grpc::internal::ClientStreamingHandler<OffloadService, grpc::ByteBuffer,
                                                    v1::PushGradientsResponse>(
             [](OffloadService* service, grpc::ServerContext* context,
                grpc::ServerReader<grpc::ByteBuffer>* reader, v1::PushGradientsResponse* response) {
               return service->PushGradientsRaw(context, reader, response);
             },
             this));
}

absl::Status OffloadService::CheckAuth(const grpc::ServerContext& context) const {
  if (auth_token_.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthMetadataKey);
  if (it == metadata.end()) {
    return absl::UnauthenticatedError("this server requires a token (authorization: Bearer ...)");
  }
  const std::string value(it->second.data(), it->second.size());
  if (!ConstantTimeEquals(value, BearerValue(auth_token_))) {
    return absl::UnauthenticatedError("wrong token");
  }
  return absl::OkStatus();
}

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
  ZO_RPC_ASSIGN_OR_RETURN(opened, registry_->Open(std::move(spec)));
  response->set_attached(opened.attached);
  *response->mutable_status() = opened.job->Status();
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
                                      const v1::CloseJobRequest* request, v1::CloseJobResponse*) {
  ZO_RPC_AUTH(context);
  return ToGrpcStatus(registry_->Close(request->job()));
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

grpc::Status OffloadService::PushGradientsRaw(grpc::ServerContext* context,
                                              grpc::ServerReader<grpc::ByteBuffer>* reader,
                                              v1::PushGradientsResponse* response) {
  ZO_RPC_AUTH(context);
  const absl::Time deadline = DeadlineOf(*context);
  grpc::ByteBuffer buffer;
  std::vector<grpc::Slice> slices;
  GradientPieceView piece;
  std::shared_ptr<Job> job;
  while (reader->Read(&buffer)) {
    if (absl::Status s = ParseGradientPiece(buffer, &slices, &piece); !s.ok()) {
      return ToGrpcStatus(s);
    }
    if (job == nullptr || job->spec().name != piece.job) {
      ZO_RPC_ASSIGN_OR_RETURN(found, registry_->Find(piece.job));
      job = std::move(found);
    }
    if (absl::Status s = job->PushGradient(piece, deadline); !s.ok()) return ToGrpcStatus(s);
    response->set_pieces(response->pieces() + 1);
    response->set_bytes(response->bytes() + static_cast<int64_t>(piece.data_bytes));
  }
  return grpc::Status::OK;
}

grpc::Status OffloadService::PullParams(grpc::ServerContext* context,
                                        const v1::PullParamsRequest* request,
                                        grpc::ServerWriter<v1::ParamPiece>* writer) {
  ZO_RPC_AUTH(context);
  ZO_RPC_ASSIGN_OR_RETURN(job, registry_->Find(request->job()));
  return ToGrpcStatus(job->PullParams(*request, DeadlineOf(*context), [&](const v1::ParamPiece& p) {
    return !context->IsCancelled() && writer->Write(p);
  }));
}

grpc::Status OffloadService::ReportStepStats(grpc::ServerContext* context,
                                             const v1::StepStats* request, v1::StepStatsResponse*) {
  ZO_RPC_AUTH(context);
  ZO_RPC_ASSIGN_OR_RETURN(job, registry_->Find(request->job()));
  return ToGrpcStatus(job->OnStepStats(*request));
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
  ZO_RPC_ASSIGN_OR_RETURN(result, job->Checkpoint(request->min_version(), DeadlineOf(*context)));
  *response = std::move(result);
  return grpc::Status::OK;
}

grpc::Status OffloadService::Restore(grpc::ServerContext* context,
                                     const v1::RestoreRequest* request,
                                     v1::RestoreResponse* response) {
  ZO_RPC_AUTH(context);
  ZO_RPC_ASSIGN_OR_RETURN(job, registry_->Find(request->job()));
  ZO_RPC_ASSIGN_OR_RETURN(result, job->Restore(request->path(), DeadlineOf(*context)));
  *response = std::move(result);
  return grpc::Status::OK;
}

}  // namespace zo
