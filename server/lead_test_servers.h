// Real zo-servers on loopback for the tests of the lead's pieces
// (LeadCheckpoints, LeadRestore): the lead's slot, whose part of the job the
// test's fake job plays (it holds no job, so a follower that asks it before
// creating its part hears that it has none), and a follower holding its
// part of `job`: one fp16 tensor "w" of 100 elements in chunks of 64, dp 1.
#ifndef ZO_SERVER_LEAD_TEST_SERVERS_H_
#define ZO_SERVER_LEAD_TEST_SERVERS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "server/offload_server.h"

namespace zo::testing {

// The OpenJob of that job for server `index` of `servers`.
inline v1::OpenJobRequest LeadTestJobRequest(const std::string& job,
                                             const std::vector<std::string>& servers, int index) {
  v1::OpenJobRequest open;
  open.set_job(job);
  v1::TensorSpec* t = open.mutable_manifest()->add_tensors();
  t->set_name("w");
  t->add_shape(100);
  t->set_dtype(v1::DTYPE_FP16);
  open.set_config_json(
      R"({"train_batch_size": 1, "fp16": {"enabled": true}, "zo": {"chunk_elems": 64}})");
  open.set_dp_world_size(1);
  for (const std::string& s : servers) open.add_servers(s);
  open.set_server_index(index);
  return open;
}

// A zo-server on a free loopback port, one optimizer thread, holding nothing.
inline absl::StatusOr<std::unique_ptr<OffloadServer>> StartLoopbackServer() {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.threads = 1;
  return OffloadServer::Start(options);
}

inline std::string LoopbackAddress(const OffloadServer& server) {
  return absl::StrCat("127.0.0.1:", server.port());
}

struct LeadTestServers {
  // Starts both servers and opens the follower's part of `job`.
  absl::Status Start(const std::string& job) {
    ZO_ASSIGN_OR_RETURN(lead_slot, StartLoopbackServer());
    ZO_ASSIGN_OR_RETURN(follower, StartLoopbackServer());
    addresses = {LoopbackAddress(*lead_slot), LoopbackAddress(*follower)};
    v1::OpenJobResponse opened;
    grpc::ClientContext context;
    const grpc::Status rpc =
        v1::Offload::NewStub(follower->InProcessChannel())
            ->OpenJob(&context, LeadTestJobRequest(job, addresses, 1), &opened);
    if (!rpc.ok()) return absl::InternalError(rpc.error_message());
    return absl::OkStatus();
  }
  void Stop() {
    if (follower != nullptr) follower->Shutdown(absl::ZeroDuration());
    if (lead_slot != nullptr) lead_slot->Shutdown(absl::ZeroDuration());
  }

  std::unique_ptr<OffloadServer> lead_slot, follower;
  std::vector<std::string> addresses;  // the lead's slot first
};

}  // namespace zo::testing

#endif  // ZO_SERVER_LEAD_TEST_SERVERS_H_
