// zo-ctl rescale: moves a running job to other servers. The job's lead
// checkpoints it and holds it at that version, the old servers close it
// saying where it went (its waiting workers hear it and follow), and the new
// lead adopts it from the checkpoint. With --checkpoint, only the last step:
// a move that stopped half way is finished from the checkpoint it left.
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/host_port.h"
#include "ctl/commands.h"
#include "ctl/rpc_target.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "rpc/call_context.h"
#include "rpc/rpc_util.h"

namespace zo::ctl {

namespace {

// Checkpoint (with freeze or thaw) on the lead of a move.
absl::StatusOr<v1::CheckpointResponse> CheckpointCall(const RpcTarget& lead, const std::string& job,
                                                      bool freeze, bool thaw) {
  v1::CheckpointRequest request;
  request.set_job(job);
  request.set_freeze(freeze);
  request.set_thaw(thaw);
  v1::CheckpointResponse response;
  grpc::ClientContext context;
  PrepareCallContext(lead.call, context);
  if (grpc::Status rpc = lead.stub->Checkpoint(&context, request, &response); !rpc.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(rpc.error_code()),
                        absl::StrCat(lead.server, ": ", DescribeRpcError(lead, rpc)));
  }
  return response;
}

}  // namespace

int RunRescale() {
  const std::string job = absl::GetFlag(FLAGS_job);
  const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint);
  const std::vector<std::string> to =
      absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipWhitespace());
  auto usage = [](const std::string& why) {
    std::cerr << "zo-ctl rescale: " << why << "\n";
    return 2;
  };
  if (to.empty() || (checkpoint.empty() == (absl::GetFlag(FLAGS_server).empty() || job.empty()))) {
    return usage(
        "give --server HOST:PORT (a server of the job) --job NAME --servers NEW,... , or "
        "--checkpoint DIR --servers NEW,... to adopt from a checkpoint");
  }
  for (size_t i = 0; i < to.size(); ++i) {
    if (absl::Status s = ParseHostPort(to[i], PortUse::kConnect).status(); !s.ok()) {
      return usage(absl::StrCat("--servers: ", s.message()));
    }
    if (std::find(to.begin(), to.begin() + i, to[i]) != to.begin() + i) {
      return usage(absl::StrCat("--servers lists ", to[i], " twice"));
    }
  }
  absl::StatusOr<RpcTarget> new_lead = RpcTargetFor(to[0]);
  if (!new_lead.ok()) return usage(std::string(new_lead.status().message()));

  std::string path = checkpoint;
  int64_t version = -1;
  std::vector<std::string> from;
  if (path.empty()) {
    absl::StatusOr<RpcTarget> named = RpcTargetFromFlags();
    if (!named.ok()) return usage(std::string(named.status().message()));
    const absl::StatusOr<v1::JobStatus> status = JobStatusOn(*named, job);
    if (!status.ok()) {
      std::cerr << "zo-ctl rescale: " << named->server << ": " << status.status().message() << "\n";
      return 1;
    }
    const v1::JobStatus& st = *status;
    from.assign(st.servers().begin(), st.servers().end());
    if (from.empty()) from = {named->server};
    if (from == to) {
      std::cerr << "zo-ctl rescale: job " << job << " is on " << absl::StrJoin(to, ",")
                << " already\n";
      return 1;
    }
    // 1. The lead checkpoints and holds the job at that version.
    absl::StatusOr<RpcTarget> lead = RpcTargetFor(from[0]);
    if (!lead.ok()) return usage(std::string(lead.status().message()));
    absl::StatusOr<v1::CheckpointResponse> frozen =
        CheckpointCall(*lead, job, /*freeze=*/true, /*thaw=*/false);
    if (!frozen.ok()) {
      std::cerr << "zo-ctl rescale: checkpoint before the move failed, nothing changed: "
                << frozen.status().message() << "\n";
      return 1;
    }
    path = frozen->path();
    version = frozen->version();
    std::cout << "zo-ctl rescale: job " << job << " held at version " << version << ", checkpoint "
              << path << "\n";
    // 2. Close it on the old servers, saying where it goes: waiting workers
    // hear it now, later calls from the tombstone. The lead last.
    int closed = 0;
    for (auto it = from.rbegin(); it != from.rend(); ++it) {
      absl::StatusOr<RpcTarget> target = RpcTargetFor(*it);
      if (!target.ok()) continue;
      v1::CloseJobRequest close;
      close.set_job(job);
      for (const std::string& s : to) close.add_moved_to(s);
      close.set_moved_version(version);
      v1::CloseJobResponse closed_response;
      grpc::ClientContext close_context;
      PrepareCallContext(target->call, close_context);
      if (grpc::Status rpc = target->stub->CloseJob(&close_context, close, &closed_response);
          !rpc.ok()) {
        std::cerr << "zo-ctl rescale: closing on " << *it << ": " << DescribeRpcError(*target, rpc)
                  << "\n";
        continue;
      }
      ++closed;
    }
    if (closed == 0) {
      (void)CheckpointCall(*lead, job, /*freeze=*/false, /*thaw=*/true);
      std::cerr << "zo-ctl rescale: could not close the job on any of its servers; it trains on "
                   "where it was\n";
      return 1;
    }
  }
  // 3. The new lead opens the job on the new servers and restores it.
  v1::AdoptJobRequest adopt;
  adopt.set_checkpoint(path);
  for (const std::string& s : to) adopt.add_servers(s);
  v1::AdoptJobResponse adopted;
  grpc::ClientContext context;
  PrepareCallContext(new_lead->call, context);
  if (grpc::Status rpc = new_lead->stub->AdoptJob(&context, adopt, &adopted); !rpc.ok()) {
    // The message names the server that failed (the new lead or a peer).
    std::cerr << "zo-ctl rescale: " << to[0] << ": "
              << absl::StatusCodeToString(FromGrpcStatus(rpc).code()) << ": " << rpc.error_message()
              << "\nThe job's state is safe in " << path
              << "; once the new servers are fixed, finish with: zo-ctl rescale --checkpoint "
              << path << " --servers " << absl::StrJoin(to, ",") << "\n";
    return 1;
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << nlohmann::json{{"job", adopted.job()},
                                {"version", adopted.version()},
                                {"checkpoint", path},
                                {"from", from},
                                {"to", to}}
                     .dump(2)
              << "\n";
  } else {
    std::cout << "job " << adopted.job() << " moved"
              << (from.empty() ? "" : absl::StrCat(" from ", absl::StrJoin(from, ","))) << " to "
              << absl::StrJoin(to, ",") << " at version " << adopted.version()
              << "; its workers follow it by themselves\n";
  }
  return 0;
}

}  // namespace zo::ctl
