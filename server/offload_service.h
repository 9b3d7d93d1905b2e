// The gRPC face of a server: checks the token, turns requests into calls on
// the jobs of a JobRegistry, and statuses into gRPC statuses. No job logic
// lives here.
//
// Every call is a callback reactor, and every call starts in Admit, the one
// place the token is checked. PushGradients and PullParams, the calls that
// wait on a step, are reactors of their own (push_reactor.h,
// pull_reactor.h): while one waits for its chunk's release or for a version,
// no thread is parked; the job keeps its wake and the server's WakeQueue
// runs it. InitParams applies each piece as it arrives. The unary calls may
// block (allocating a job, checkpoint I/O, a restore across servers), so
// their handlers run on a HandlerPool, never on the callback threads that
// move the streams.
#ifndef ZO_SERVER_OFFLOAD_SERVICE_H_
#define ZO_SERVER_OFFLOAD_SERVICE_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "server/call_auth.h"
#include "server/handler_pool.h"
#include "server/job_registry.h"
#include "server/shared_regions.h"

namespace zo {

class OffloadService final
    : public v1::Offload::WithRawCallbackMethod_PushGradients<
          v1::Offload::WithRawCallbackMethod_PullParams<v1::Offload::CallbackService>> {
 public:
  // `auth_token` empty: calls are not checked. The registry is borrowed.
  // `regions`: the same-host route's (borrowed).
  OffloadService(JobRegistry* registry, SharedRegions* regions, std::string auth_token,
                 int64_t max_message_bytes);

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::GetServerInfoResponse* response) override;
  grpc::ServerUnaryReactor* OpenJob(grpc::CallbackServerContext* context,
                                    const v1::OpenJobRequest* request,
                                    v1::OpenJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJobStatus(grpc::CallbackServerContext* context,
                                         const v1::GetJobStatusRequest* request,
                                         v1::JobStatus* response) override;
  grpc::ServerUnaryReactor* CloseJob(grpc::CallbackServerContext* context,
                                     const v1::CloseJobRequest* request,
                                     v1::CloseJobResponse* response) override;
  grpc::ServerUnaryReactor* AdoptJob(grpc::CallbackServerContext* context,
                                     const v1::AdoptJobRequest* request,
                                     v1::AdoptJobResponse* response) override;
  grpc::ServerReadReactor<v1::ParamInitPiece>* InitParams(
      grpc::CallbackServerContext* context, v1::InitParamsResponse* response) override;
  // Each piece as the raw buffer gRPC received, accumulated from its slices
  // (gradient_piece_view.h) instead of parsed into a message.
  grpc::ServerReadReactor<grpc::ByteBuffer>* PushGradients(grpc::CallbackServerContext* context,
                                                           grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* PullParams(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* ReportStepStats(grpc::CallbackServerContext* context,
                                            const v1::StepStats* request,
                                            v1::StepStatsResponse* response) override;
  grpc::ServerUnaryReactor* GetStepCompensation(grpc::CallbackServerContext* context,
                                                const v1::StepCompensationRequest* request,
                                                v1::StepCompensation* response) override;
  grpc::ServerUnaryReactor* SetStepLr(grpc::CallbackServerContext* context,
                                      const v1::StepLrRequest* request,
                                      v1::StepLrResponse* response) override;
  grpc::ServerUnaryReactor* AttachRegion(grpc::CallbackServerContext* context,
                                         const v1::AttachRegionRequest* request,
                                         v1::AttachRegionResponse* response) override;
  grpc::ServerUnaryReactor* CommitStep(grpc::CallbackServerContext* context,
                                       const v1::StepCommit* request,
                                       v1::StepCommitResponse* response) override;
  grpc::ServerUnaryReactor* WriteCheckpointPart(grpc::CallbackServerContext* context,
                                                const v1::WriteCheckpointPartRequest* request,
                                                v1::WriteCheckpointPartResponse* response) override;
  grpc::ServerUnaryReactor* RestorePart(grpc::CallbackServerContext* context,
                                        const v1::RestorePartRequest* request,
                                        v1::RestorePartResponse* response) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* context,
                                       const v1::CheckpointRequest* request,
                                       v1::CheckpointResponse* response) override;
  grpc::ServerUnaryReactor* Restore(grpc::CallbackServerContext* context,
                                    const v1::RestoreRequest* request,
                                    v1::RestoreResponse* response) override;

 private:
  // UNAUTHENTICATED unless the call carries the token: the check of every
  // call, before anything else happens.
  absl::Status Admit(const grpc::CallbackServerContext& context) const;
  // A unary call: Admit, then `handler` on the handler pool, then the call
  // finishes with its status.
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context,
                                  std::function<absl::Status()> handler);

  JobRegistry* const registry_;
  SharedRegions* const regions_;
  const CallAuth auth_;
  const int64_t max_message_bytes_;
  HandlerPool handlers_;  // last: joined before the members its tasks use go
};

}  // namespace zo

#endif  // ZO_SERVER_OFFLOAD_SERVICE_H_
