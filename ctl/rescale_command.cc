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

// The command line is wrong: exit status 2.
int Usage(absl::string_view why) {
  std::cerr << "zo-ctl rescale: " << why << "\n";
  return 2;
}

// The move failed: exit status 1.
int Failed(absl::string_view why) {
  std::cerr << "zo-ctl rescale: " << why << "\n";
  return 1;
}

// One rescale, step by step. Each step returns the command's exit status
// when it ends there (having said why on stderr), or nullopt to go on.
class Rescale {
 public:
  int Run();

 private:
  std::optional<int> ReadFlags();
  std::optional<int> MoveOffOldServers();
  std::optional<int> FindOldServers(const RpcTarget& named);
  std::optional<int> Hold(const RpcTarget& old_lead);
  int CloseOnOldServers();
  int Adopt();
  void PrintMoved(const v1::AdoptJobResponse& adopted) const;

  std::string job_;
  std::vector<std::string> to_;  // the new servers, the new lead first
  std::optional<RpcTarget> new_lead_;
  std::vector<std::string> from_;  // the old servers; none when adopting from --checkpoint
  std::string path_;               // the checkpoint the new servers restore
  int64_t version_ = -1;           // the version the job was held at
};

int Rescale::Run() {
  if (const std::optional<int> exit = ReadFlags()) return *exit;
  // Without --checkpoint the job is live where it is: held and closed there first.
  if (path_.empty()) {
    if (const std::optional<int> exit = MoveOffOldServers()) return *exit;
  }
  return Adopt();
}

// --servers (checked, and the new lead reached through the first), and
// either the live job (--server and --job) or the --checkpoint to adopt.
std::optional<int> Rescale::ReadFlags() {
  job_ = absl::GetFlag(FLAGS_job);
  path_ = absl::GetFlag(FLAGS_checkpoint);
  to_ = absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipWhitespace());
  const bool job_named = !absl::GetFlag(FLAGS_server).empty() && !job_.empty();
  if (to_.empty() || job_named == !path_.empty()) {
    return Usage(
        "give --server HOST:PORT (a server of the job) --job NAME --servers NEW,... , or "
        "--checkpoint DIR --servers NEW,... to adopt from a checkpoint");
  }
  for (size_t i = 0; i < to_.size(); ++i) {
    if (absl::Status s = ParseHostPort(to_[i], PortUse::kConnect).status(); !s.ok()) {
      return Usage(absl::StrCat("--servers: ", s.message()));
    }
    if (std::find(to_.begin(), to_.begin() + i, to_[i]) != to_.begin() + i) {
      return Usage(absl::StrCat("--servers lists ", to_[i], " twice"));
    }
  }
  absl::StatusOr<RpcTarget> new_lead = RpcTargetFor(to_[0]);
  if (!new_lead.ok()) return Usage(new_lead.status().message());
  new_lead_ = *std::move(new_lead);
  return std::nullopt;
}

std::optional<int> Rescale::MoveOffOldServers() {
  absl::StatusOr<RpcTarget> named = RpcTargetFromFlags();
  if (!named.ok()) return Usage(named.status().message());
  if (const std::optional<int> exit = FindOldServers(*named)) return exit;
  // 1. The lead checkpoints and holds the job at that version.
  absl::StatusOr<RpcTarget> old_lead = RpcTargetFor(from_[0]);
  if (!old_lead.ok()) return Usage(old_lead.status().message());
  if (const std::optional<int> exit = Hold(*old_lead)) return exit;
  // 2. Close it on the old servers, saying where it goes: waiting workers
  // hear it now, later calls from the tombstone. The lead last.
  if (CloseOnOldServers() == 0) {
    (void)CheckpointCall(*old_lead, job_, /*freeze=*/false, /*thaw=*/true);
    return Failed("could not close the job on any of its servers; it trains on where it was");
  }
  return std::nullopt;
}

// The job's servers, as the server named knows them.
std::optional<int> Rescale::FindOldServers(const RpcTarget& named) {
  const absl::StatusOr<v1::JobStatus> status = JobStatusOn(named, job_);
  if (!status.ok()) return Failed(absl::StrCat(named.server, ": ", status.status().message()));
  from_.assign(status->servers().begin(), status->servers().end());
  if (from_.empty()) from_ = {named.server};
  if (from_ == to_) {
    return Failed(absl::StrCat("job ", job_, " is on ", absl::StrJoin(to_, ","), " already"));
  }
  return std::nullopt;
}

std::optional<int> Rescale::Hold(const RpcTarget& old_lead) {
  absl::StatusOr<v1::CheckpointResponse> frozen =
      CheckpointCall(old_lead, job_, /*freeze=*/true, /*thaw=*/false);
  if (!frozen.ok()) {
    return Failed(absl::StrCat("checkpoint before the move failed, nothing changed: ",
                               frozen.status().message()));
  }
  path_ = frozen->path();
  version_ = frozen->version();
  std::cout << "zo-ctl rescale: job " << job_ << " held at version " << version_ << ", checkpoint "
            << path_ << "\n";
  return std::nullopt;
}

// Returns on how many old servers the job closed; each one that could not
// be reached or refused is said on stderr.
int Rescale::CloseOnOldServers() {
  int closed = 0;
  for (auto it = from_.rbegin(); it != from_.rend(); ++it) {
    absl::StatusOr<RpcTarget> target = RpcTargetFor(*it);
    if (!target.ok()) continue;
    v1::CloseJobRequest close;
    close.set_job(job_);
    for (const std::string& s : to_) close.add_moved_to(s);
    close.set_moved_version(version_);
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
  return closed;
}

// 3. The new lead opens the job on the new servers and restores it.
int Rescale::Adopt() {
  v1::AdoptJobRequest adopt;
  adopt.set_checkpoint(path_);
  for (const std::string& s : to_) adopt.add_servers(s);
  v1::AdoptJobResponse adopted;
  grpc::ClientContext context;
  PrepareCallContext(new_lead_->call, context);
  if (grpc::Status rpc = new_lead_->stub->AdoptJob(&context, adopt, &adopted); !rpc.ok()) {
    // The message names the server that failed (the new lead or a peer).
    return Failed(
        absl::StrCat(to_[0], ": ", absl::StatusCodeToString(FromGrpcStatus(rpc).code()), ": ",
                     rpc.error_message(), "\nThe job's state is safe in ", path_,
                     "; once the new servers are fixed, finish with: zo-ctl rescale --checkpoint ",
                     path_, " --servers ", absl::StrJoin(to_, ",")));
  }
  PrintMoved(adopted);
  return 0;
}

void Rescale::PrintMoved(const v1::AdoptJobResponse& adopted) const {
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << nlohmann::json{{"job", adopted.job()},
                                {"version", adopted.version()},
                                {"checkpoint", path_},
                                {"from", from_},
                                {"to", to_}}
                     .dump(2)
              << "\n";
  } else {
    std::cout << "job " << adopted.job() << " moved"
              << (from_.empty() ? "" : absl::StrCat(" from ", absl::StrJoin(from_, ","))) << " to "
              << absl::StrJoin(to_, ",") << " at version " << adopted.version()
              << "; its workers follow it by themselves\n";
  }
}

}  // namespace

int RunRescale() { return Rescale().Run(); }

}  // namespace zo::ctl
