// The gRPC face of a server: checks the token, turns requests into calls on
// the jobs of a JobRegistry, and statuses into gRPC statuses. No job logic
// lives here.
//
// PushGradients and PullParams, the calls that wait on a step, are callback
// reactors (push_reactor.h, pull_reactor.h): while one waits for its chunk's
// release or for a version, no thread is parked; the job keeps its wake and
// the server's WakeQueue runs it. The other calls are synchronous handlers:
// they do blocking work (allocating a job, checkpoint I/O, a restore across
// servers) that belongs on gRPC's sync pool, not on the callback threads
// that move the streams.
#ifndef ZO_SERVER_OFFLOAD_SERVICE_H_
#define ZO_SERVER_OFFLOAD_SERVICE_H_

#include <string>

#include "absl/status/status.h"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "server/call_auth.h"
#include "server/job_registry.h"
#include "server/shared_regions.h"

namespace zo {

class OffloadService final
    : public v1::Offload::WithRawCallbackMethod_PushGradients<
          v1::Offload::WithRawCallbackMethod_PullParams<v1::Offload::Service>> {
 public:
  // `auth_token` empty: calls are not checked. The registry is borrowed.
  // `regions`: the same-host route's (borrowed).
  OffloadService(JobRegistry* registry, SharedRegions* regions, std::string auth_token,
                 int64_t max_message_bytes);

  grpc::Status GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest* request,
                             v1::GetServerInfoResponse* response) override;
  grpc::Status OpenJob(grpc::ServerContext* context, const v1::OpenJobRequest* request,
                       v1::OpenJobResponse* response) override;
  grpc::Status GetJobStatus(grpc::ServerContext* context, const v1::GetJobStatusRequest* request,
                            v1::JobStatus* response) override;
  grpc::Status CloseJob(grpc::ServerContext* context, const v1::CloseJobRequest* request,
                        v1::CloseJobResponse* response) override;
  grpc::Status AdoptJob(grpc::ServerContext* context, const v1::AdoptJobRequest* request,
                        v1::AdoptJobResponse* response) override;
  grpc::Status InitParams(grpc::ServerContext* context,
                          grpc::ServerReader<v1::ParamInitPiece>* reader,
                          v1::InitParamsResponse* response) override;
  // Each piece as the raw buffer gRPC received, accumulated from its slices
  // (gradient_piece_view.h) instead of parsed into a message.
  grpc::ServerReadReactor<grpc::ByteBuffer>* PushGradients(grpc::CallbackServerContext* context,
                                                           grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* PullParams(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request) override;
  grpc::Status ReportStepStats(grpc::ServerContext* context, const v1::StepStats* request,
                               v1::StepStatsResponse* response) override;
  grpc::Status SetStepLr(grpc::ServerContext* context, const v1::StepLrRequest* request,
                         v1::StepLrResponse* response) override;
  grpc::Status AttachRegion(grpc::ServerContext* context, const v1::AttachRegionRequest* request,
                            v1::AttachRegionResponse* response) override;
  grpc::Status CommitStep(grpc::ServerContext* context, const v1::StepCommit* request,
                          v1::StepCommitResponse* response) override;
  grpc::Status WriteCheckpointPart(grpc::ServerContext* context,
                                   const v1::WriteCheckpointPartRequest* request,
                                   v1::WriteCheckpointPartResponse* response) override;
  grpc::Status RestorePart(grpc::ServerContext* context, const v1::RestorePartRequest* request,
                           v1::RestorePartResponse* response) override;
  grpc::Status Checkpoint(grpc::ServerContext* context, const v1::CheckpointRequest* request,
                          v1::CheckpointResponse* response) override;
  grpc::Status Restore(grpc::ServerContext* context, const v1::RestoreRequest* request,
                       v1::RestoreResponse* response) override;

 private:
  JobRegistry* const registry_;
  SharedRegions* const regions_;
  const CallAuth auth_;
  const int64_t max_message_bytes_;
};

}  // namespace zo

#endif  // ZO_SERVER_OFFLOAD_SERVICE_H_
