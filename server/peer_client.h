// Calls from one server of a job to the others: step statistics to the lead,
// the lead's commits, checkpoint and restore of parts, and opening a job the
// lead adopts from a checkpoint. Channels are made on
// first use with the server's own credentials (the shared token, TLS roots).
#ifndef ZO_SERVER_PEER_CLIENT_H_
#define ZO_SERVER_PEER_CLIENT_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/zo/v1/offload_service.grpc.pb.h"

namespace zo {

struct PeerCredentials {
  std::string auth_token;      // empty: none
  std::string tls_root_certs;  // PEM; non-empty: TLS
};

// Thread-safe.
class PeerClient {
 public:
  explicit PeerClient(PeerCredentials credentials);

  absl::Status ReportStepStats(const std::string& address, const v1::StepStats& stats,
                               absl::Duration timeout);
  absl::Status CommitStep(const std::string& address, const v1::StepCommit& commit,
                          absl::Duration timeout);
  absl::StatusOr<v1::WriteCheckpointPartResponse> WriteCheckpointPart(
      const std::string& address, const v1::WriteCheckpointPartRequest& request,
      absl::Duration timeout);
  absl::Status RestorePart(const std::string& address, const v1::RestorePartRequest& request,
                           absl::Duration timeout);
  // A job adopted from a checkpoint (AdoptJob) is opened on the other new
  // servers by the new lead, and closed again when the adoption fails.
  absl::StatusOr<v1::OpenJobResponse> OpenJob(const std::string& address,
                                              const v1::OpenJobRequest& request,
                                              absl::Duration timeout);
  absl::Status CloseJob(const std::string& address, const v1::CloseJobRequest& request,
                        absl::Duration timeout);
  // The lead asks a follower that has not reported for a while whether it
  // still has the job (NOT_FOUND: it restarted and lost its part).
  // `wait_for_ready`: a server that just came up is waited for (until
  // `timeout`) instead of failing at once while the channel backs off, for
  // a question whose "cannot tell" answer refuses an open.
  absl::StatusOr<v1::JobStatus> GetJobStatus(const std::string& address, const std::string& job,
                                             absl::Duration timeout, bool wait_for_ready = false);

 private:
  // INVALID_ARGUMENT when `address` is not host:port (rpc/channel.h).
  absl::StatusOr<v1::Offload::Stub*> StubFor(const std::string& address);
  // One unary call to `address` made by call(stub, context, response): the
  // response, or the error as "<what> to server <address>: ...".
  template <typename Response, typename Call>
  absl::StatusOr<Response> Unary(const std::string& address, const char* what,
                                 absl::Duration timeout, Call call, bool wait_for_ready = false);

  const PeerCredentials credentials_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<v1::Offload::Stub>> stubs_;
};

}  // namespace zo

#endif  // ZO_SERVER_PEER_CLIENT_H_
