// zo-ctl's calls to zo-servers (status, checkpoint, jobs, restore, close)
// through the shared RPC layer (rpc/, reached as ctl/rpc_target.h says):
// answers as text or JSON, a failure as one line that names the server and
// says what to check.
#include <algorithm>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/units.h"
#include "ctl/commands.h"
#include "ctl/message_json.h"
#include "ctl/rpc_target.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "rpc/call_context.h"

ABSL_FLAG(std::string, server, "",
          "status, checkpoint, close, restore: zo-server address HOST:PORT (the job's lead server "
          "for checkpoint and restore; any of its servers for close); jobs: one or more, "
          "comma-separated");
ABSL_FLAG(std::string, job, "", "status, checkpoint, close, restore: the job's name");
ABSL_FLAG(bool, delete_checkpoints, false,
          "close: also remove the job's checkpoints from the servers' checkpoint directory");
ABSL_FLAG(std::string, auth_token_file, "",
          "status, checkpoint, jobs, close: file holding the servers' auth token, when they have "
          "one");
ABSL_FLAG(std::string, tls_ca, "",
          "status, checkpoint: PEM file of the CA that signed the server's certificate; "
          "connects with TLS when given");
ABSL_FLAG(int, timeout, 30,
          "status, checkpoint, jobs, close: seconds to wait for each answer; restore: for its "
          "status, and ten times this for the restore itself");
ABSL_FLAG(bool, force, false,
          "restore: roll back a live job that went on past the checkpoint (without it, refused)");

namespace zo::ctl {
namespace {

// "b:3 UNREACHABLE since 2026-11-29 06:12:03 UTC (connection refused)".
std::string FormatFollower(const v1::FollowerState& f) {
  if (f.since_unix_ms() == 0) return absl::StrCat(f.server(), " not asked yet");
  const std::string since = absl::FormatTime(
      "%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(f.since_unix_ms()), absl::UTCTimeZone());
  switch (f.state()) {
    case v1::FollowerState::UNREACHABLE:
      return absl::StrCat(f.server(), " UNREACHABLE since ", since, " (", f.error(), ")");
    case v1::FollowerState::WITHOUT_JOB:
      return absl::StrCat(f.server(), " LOST THE JOB (restarted) since ", since, " (", f.error(),
                          ")");
    default:
      return absl::StrCat(f.server(), " up since ", since);
  }
}

// The lead's first follower that is not up, or nullptr.
const v1::FollowerState* MissingFollower(const v1::JobStatus& st) {
  for (const v1::FollowerState& f : st.followers()) {
    if (f.state() != v1::FollowerState::UP) return &f;
  }
  return nullptr;
}

std::string FormatJobStatus(const RpcTarget& target, const v1::JobStatus& st) {
  const v1::FollowerState* missing = MissingFollower(st);
  std::vector<std::string> followers;
  for (const v1::FollowerState& f : st.followers()) followers.push_back(FormatFollower(f));
  std::vector<std::pair<std::string, std::string>> rows = {
      {"version",
       absl::StrCat(st.version(), " (gradients are pushed for step ", st.open_step(), ")")},
      {"applied steps", absl::StrCat(st.applied_steps())},
      {"loss scale", absl::StrCat(st.loss_scale())},
      {"health",
       !st.needs_restore().empty()
           ? absl::StrCat(st.restoring() ? "RESTORING: " : "NEEDS RESTORE: ", st.needs_restore())
       : !st.waiting_on_peer().empty() ? absl::StrCat("STUCK ON A PEER: ", st.waiting_on_peer())
       : missing != nullptr            ? absl::StrCat("FOLLOWER DOWN: ", FormatFollower(*missing))
                                       : std::string("ok")},
      {"data parallel", absl::StrCat(st.dp_world_size(), " rank(s)")},
      {"elements",
       absl::StrCat(FormatCount(static_cast<double>(st.total_elems())), " in the job; ",
                    FormatCount(static_cast<double>(st.local_elems())), " on this server, ",
                    FormatCount(static_cast<double>(st.nvme_elems())), " on NVMe")},
      {"last step", absl::StrCat("grad norm ", st.last_grad_norm(), ", lr ", st.last_lr(),
                                 st.last_skipped() ? ", skipped (overflow)" : "")},
      {"last checkpoint",
       absl::StrCat(st.last_checkpoint_step() < 0
                        ? std::string("none")
                        : absl::StrCat("step ", st.last_checkpoint_step()),
                    st.last_checkpoint_error().empty()
                        ? std::string()
                        : absl::StrCat("; the last attempt FAILED (", st.last_checkpoint_error(),
                                       "), ", st.checkpoint_failures(), " failed so far"))},
      {"waiting calls", absl::StrCat(st.waiting_pulls(), " pull(s) for a version to come, ",
                                     st.waiting_pushes(), " push(es) for a chunk still updating")},
      {"RAM", absl::StrCat(FormatBytes(static_cast<double>(st.ram_bytes())),
                           " for this job on this server")},
      {"speculative update",
       st.no_speculation().empty()
           ? absl::StrFormat("on: %d chunks updated before their step was decided, %d kept, %d "
                             "updated again (%.3f s)",
                             st.speculated_chunks(), st.confirmed_chunks(), st.redone_chunks(),
                             st.redo_seconds())
           : absl::StrCat("off: ", st.no_speculation())},
  };
  if (!followers.empty()) rows.emplace_back("followers", absl::StrJoin(followers, "; "));
  // Fields added to JobStatus after this table still show.
  constexpr int kLastFieldShown = 16;
  const auto shown_above = [](int number) {
    return number <= kLastFieldShown ||
           (number >= v1::JobStatus::kWaitingPullsFieldNumber &&
            number <= v1::JobStatus::kRamBytesFieldNumber) ||
           number == v1::JobStatus::kFollowersFieldNumber ||
           number == v1::JobStatus::kLastCheckpointErrorFieldNumber ||
           number == v1::JobStatus::kCheckpointFailuresFieldNumber ||
           number == v1::JobStatus::kRestoringFieldNumber ||
           (number >= v1::JobStatus::kNoSpeculationFieldNumber &&
            number <= v1::JobStatus::kRedoSecondsFieldNumber);
  };
  const nlohmann::ordered_json all = MessageToJson(st);
  const google::protobuf::Descriptor* d = st.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    if (shown_above(d->field(i)->number())) continue;
    const std::string& name = d->field(i)->name();
    rows.emplace_back(absl::StrReplaceAll(name, {{"_", " "}}), all[name].dump());
  }
  std::string text = absl::StrCat("job ", st.job(), " on server ", st.server_index(), " of ",
                                  st.num_servers(), " (", target.server, ")\n");
  for (const auto& [label, value] : rows) {
    absl::StrAppend(&text, absl::StrFormat("  %-16s %s\n", label, value));
  }
  return text;
}

}  // namespace

int RunStatus() {
  absl::StatusOr<RpcTarget> target = RpcTargetFromFlags();
  if (!target.ok()) {
    std::cerr << "zo-ctl status: " << target.status().message() << "\n";
    return 2;
  }
  const absl::StatusOr<v1::JobStatus> status = JobStatusOn(*target, absl::GetFlag(FLAGS_job));
  if (!status.ok()) {
    std::cerr << "zo-ctl status: " << status.status().message() << "\n";
    return 1;
  }
  std::cout << (absl::GetFlag(FLAGS_json) ? MessageToJson(*status).dump(2) + "\n"
                                          : FormatJobStatus(*target, *status));
  return 0;
}

int RunCheckpoint() {
  absl::StatusOr<RpcTarget> target = RpcTargetFromFlags();
  if (!target.ok()) {
    std::cerr << "zo-ctl checkpoint: " << target.status().message() << "\n";
    return 2;
  }
  v1::CheckpointRequest request;
  request.set_job(absl::GetFlag(FLAGS_job));
  v1::CheckpointResponse response;
  grpc::ClientContext context;
  PrepareCallContext(target->call, context);
  const grpc::Status rpc = target->stub->Checkpoint(&context, request, &response);
  if (!rpc.ok()) {
    std::cerr << "zo-ctl checkpoint: " << DescribeRpcError(*target, rpc) << "\n";
    return 1;
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << MessageToJson(response).dump(2) << "\n";
  } else {
    std::cout << "checkpoint of job " << request.job() << " committed: version "
              << response.version() << " at " << response.path() << "\n";
  }
  return 0;
}

namespace {

std::string JobState(const v1::JobStatus& st) {
  if (!st.needs_restore().empty()) return "NEEDS RESTORE";
  if (!st.waiting_on_peer().empty()) return "STUCK ON A PEER";
  return "ok";
}

}  // namespace

int RunJobs() {
  const std::vector<std::string> servers =
      absl::StrSplit(absl::GetFlag(FLAGS_server), ',', absl::SkipWhitespace());
  if (servers.empty()) {
    std::cerr << "zo-ctl jobs: give --server HOST:PORT[,HOST:PORT...]\n";
    return 2;
  }
  nlohmann::json rows = nlohmann::json::array();
  std::string text = absl::StrFormat("%-22s %-20s %8s %-7s %10s %10s  %s\n", "SERVER", "JOB",
                                     "VERSION", "PART", "RAM", "NVME", "STATE");
  int failed = 0;
  for (const std::string& server : servers) {
    absl::StatusOr<RpcTarget> target = RpcTargetFor(server);
    if (!target.ok()) {
      std::cerr << "zo-ctl jobs: " << target.status().message() << "\n";
      return 2;
    }
    v1::GetServerInfoResponse info;
    grpc::ClientContext context;
    PrepareCallContext(target->call, context);
    if (grpc::Status rpc = target->stub->GetServerInfo(&context, {}, &info); !rpc.ok()) {
      std::cerr << "zo-ctl jobs: " << server << ": " << DescribeRpcError(*target, rpc) << "\n";
      ++failed;
      continue;
    }
    for (const std::string& job : info.jobs()) {
      v1::GetJobStatusRequest request;
      request.set_job(job);
      v1::JobStatus st;
      grpc::ClientContext status_context;
      PrepareCallContext(target->call, status_context);
      const grpc::Status rpc = target->stub->GetJobStatus(&status_context, request, &st);
      if (rpc.error_code() == grpc::StatusCode::NOT_FOUND) continue;  // closed meanwhile
      if (!rpc.ok()) {
        std::cerr << "zo-ctl jobs: " << server << ": " << DescribeRpcError(*target, rpc) << "\n";
        ++failed;
        continue;
      }
      nlohmann::json row = MessageToJson(st);
      row["server"] = server;
      row["state"] = JobState(st);
      rows.push_back(row);
      absl::StrAppend(
          &text,
          absl::StrFormat("%-22s %-20s %8d %-7s %10s %10s  %s\n", server, job, st.version(),
                          absl::StrCat(st.server_index(), "/", st.num_servers()),
                          FormatBytes(static_cast<double>(st.ram_bytes())),
                          FormatBytes(12.0 * static_cast<double>(st.nvme_elems())), JobState(st)));
    }
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << rows.dump(2) << "\n";
  } else if (rows.empty() && failed == 0) {
    std::cout << "no jobs on " << absl::StrJoin(servers, ", ") << "\n";
  } else {
    std::cout << text;
  }
  return failed == 0 ? 0 : 1;
}

int RunRestore() {
  absl::StatusOr<RpcTarget> lead = RpcTargetFromFlags();
  if (!lead.ok()) {
    std::cerr << "zo-ctl restore: " << lead.status().message() << "\n";
    return 2;
  }
  const std::string job = absl::GetFlag(FLAGS_job);
  const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint);
  const absl::StatusOr<v1::JobStatus> status = JobStatusOn(*lead, job);
  if (!status.ok()) {
    std::cerr << "zo-ctl restore: " << status.status().message() << "\n";
    return 1;
  }
  const v1::JobStatus& st = *status;
  if (st.server_index() != 0) {
    std::cerr << "zo-ctl restore: " << lead->server << " is server " << st.server_index()
              << " of job " << job << "; restores are run by its lead, "
              << (st.servers().empty() ? std::string("server 0") : st.servers(0)) << "\n";
    return 1;
  }
  // A healthy job is rolled back only when asked: its workers lose the
  // steps since the checkpoint.
  if (st.needs_restore().empty() && !absl::GetFlag(FLAGS_force)) {
    if (checkpoint.empty() && st.version() == st.last_checkpoint_step()) {
      std::cout << "job " << job << " is at version " << st.version()
                << ", its latest checkpoint: nothing to restore\n";
      return 0;
    }
    std::cerr << "zo-ctl restore: job " << job << " is live at version " << st.version()
              << (st.last_checkpoint_step() >= 0
                      ? absl::StrCat(" (latest checkpoint: step ", st.last_checkpoint_step(), ")")
                      : std::string(" with no checkpoint on record"))
              << "; restoring rolls it back and its workers redo the steps since. Add --force "
                 "to do so\n";
    return 1;
  }
  v1::RestoreRequest request;
  request.set_job(job);
  request.set_path(checkpoint);
  request.set_rollback(true);  // the workers hear of it and follow
  v1::RestoreResponse response;
  grpc::ClientContext context;
  CallOptions call = lead->call;
  call.timeout *= 10;
  PrepareCallContext(call, context);
  if (grpc::Status rpc = lead->stub->Restore(&context, request, &response); !rpc.ok()) {
    std::cerr << "zo-ctl restore: " << DescribeRpcError(*lead, rpc) << "\n";
    return 1;
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << MessageToJson(response).dump(2) << "\n";
  } else {
    std::cout << "job " << job << " restored to version " << response.version() << " from "
              << response.path() << " on its " << st.num_servers()
              << " server(s); its workers resume at step " << response.version() + 1 << "\n";
  }
  return 0;
}

int RunClose() {
  absl::StatusOr<RpcTarget> first = RpcTargetFromFlags();
  if (!first.ok()) {
    std::cerr << "zo-ctl close: " << first.status().message() << "\n";
    return 2;
  }
  const std::string job = absl::GetFlag(FLAGS_job);
  // The server named knows the job's whole server list.
  const absl::StatusOr<v1::JobStatus> status = JobStatusOn(*first, job);
  if (!status.ok()) {
    std::cerr << "zo-ctl close: " << first->server << ": " << status.status().message() << "\n";
    return 1;
  }
  const v1::JobStatus& st = *status;
  std::vector<std::string> servers(st.servers().begin(), st.servers().end());
  if (servers.empty()) servers = {first->server};  // a server too old to list them
  // The lead last: it removes the checkpoints once the others are closed.
  std::reverse(servers.begin(), servers.end());
  nlohmann::json results = nlohmann::json::array();
  int64_t freed_ram = 0;
  int64_t freed_nvme = 0;
  int removed = 0;
  int failed = 0;
  for (size_t i = 0; i < servers.size(); ++i) {
    const bool lead = i + 1 == servers.size();
    absl::StatusOr<RpcTarget> target = RpcTargetFor(servers[i]);
    if (!target.ok()) {
      std::cerr << "zo-ctl close: " << servers[i] << ": " << target.status().message() << "\n";
      ++failed;
      continue;
    }
    v1::CloseJobRequest request;
    request.set_job(job);
    request.set_delete_checkpoints(lead && absl::GetFlag(FLAGS_delete_checkpoints));
    v1::CloseJobResponse response;
    grpc::ClientContext context;
    PrepareCallContext(target->call, context);
    const grpc::Status rpc = target->stub->CloseJob(&context, request, &response);
    nlohmann::json row = {{"server", servers[i]}};
    if (rpc.error_code() == grpc::StatusCode::NOT_FOUND) {
      row["closed"] = false;
      row["note"] = "not open there";
    } else if (!rpc.ok()) {
      std::cerr << "zo-ctl close: " << servers[i] << ": " << DescribeRpcError(*target, rpc) << "\n";
      row["error"] = DescribeRpcError(*target, rpc);
      ++failed;
    } else {
      row["closed"] = true;
      row.update(MessageToJson(response));
      freed_ram += response.freed_ram_bytes();
      freed_nvme += response.freed_nvme_bytes();
      removed += response.removed_checkpoints_size();
    }
    results.push_back(row);
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << results.dump(2) << "\n";
  } else {
    std::cout << absl::StrFormat(
        "job %s closed on %d of %d servers: %s of RAM and %s of NVMe freed", job,
        static_cast<int>(servers.size()) - failed, static_cast<int>(servers.size()),
        FormatBytes(static_cast<double>(freed_ram)), FormatBytes(static_cast<double>(freed_nvme)));
    if (absl::GetFlag(FLAGS_delete_checkpoints)) {
      std::cout << absl::StrFormat(", %d checkpoints removed", removed);
    }
    std::cout << "\n";
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace zo::ctl
