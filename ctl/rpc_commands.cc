// zo-ctl status and checkpoint: one call to a zo-server through the shared
// RPC layer (rpc/), its answer as text or JSON, its failure as one line that
// says what to check.
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "common/command_line.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "ctl/commands.h"
#include "ctl/message_json.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "rpc/call_context.h"
#include "rpc/channel.h"
#include "rpc/rpc_util.h"

ABSL_FLAG(std::string, server, "",
          "status, checkpoint: zo-server address HOST:PORT (the job's lead server for "
          "checkpoint)");
ABSL_FLAG(std::string, job, "", "status, checkpoint: the job's name");
ABSL_FLAG(std::string, auth_token_file, "",
          "status, checkpoint: file holding the servers' auth token, when they have one");
ABSL_FLAG(std::string, tls_ca, "",
          "status, checkpoint: PEM file of the CA that signed the server's certificate; "
          "connects with TLS when given");
ABSL_FLAG(int, timeout, 30, "status, checkpoint: seconds to wait for the server's answer");

namespace zo::ctl {
namespace {

// What a status or checkpoint call needs besides its request.
struct RpcTarget {
  std::string server;
  std::unique_ptr<v1::Offload::Stub> stub;
  CallOptions call;
  bool tls = false;
};

absl::StatusOr<RpcTarget> RpcTargetFromFlags() {
  RpcTarget target;
  target.server = absl::GetFlag(FLAGS_server);
  const int timeout_s = absl::GetFlag(FLAGS_timeout);
  if (target.server.empty() || absl::GetFlag(FLAGS_job).empty()) {
    return absl::InvalidArgumentError("give --server HOST:PORT and --job NAME");
  }
  if (timeout_s < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout must be >= 1 second, got ", timeout_s));
  }
  target.call.timeout = absl::Seconds(timeout_s);
  if (const std::string file = absl::GetFlag(FLAGS_auth_token_file); !file.empty()) {
    ZO_ASSIGN_OR_RETURN(target.call.auth_token, ReadTokenFile("auth-token-file", file));
  }
  ChannelOptions channel;
  if (const std::string ca = absl::GetFlag(FLAGS_tls_ca); !ca.empty()) {
    ZO_ASSIGN_OR_RETURN(channel.tls_root_certs, ReadFlagFile("tls-ca", ca));
    target.tls = true;
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> made = NewChannel(target.server, channel);
  if (!made.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--server ", made.status().message()));
  }
  target.stub = v1::Offload::NewStub(*std::move(made));
  return target;
}

// One line: the code, the server's message and what to check.
std::string DescribeRpcError(const RpcTarget& target, const grpc::Status& status) {
  const absl::Status s = FromGrpcStatus(status);
  std::string line = absl::StrCat(absl::StatusCodeToString(s.code()), ": ",
                                  absl::StrReplaceAll(s.message(), {{"\n", " "}}));
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
      absl::StrAppend(&line, " (is zo-server running at ", target.server, "?",
                      target.tls ? "" : " if it serves TLS, give --tls-ca", ")");
      break;
    case absl::StatusCode::kDeadlineExceeded:
      absl::StrAppend(&line, " (no answer from ", target.server, " within ",
                      absl::FormatDuration(target.call.timeout), "; raise --timeout?)");
      break;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      absl::StrAppend(&line, " (check --auth-token-file against the server's token)");
      break;
    default:
      break;
  }
  return line;
}

std::string FormatJobStatus(const RpcTarget& target, const v1::JobStatus& st) {
  std::vector<std::pair<std::string, std::string>> rows = {
      {"version",
       absl::StrCat(st.version(), " (gradients are pushed for step ", st.open_step(), ")")},
      {"applied steps", absl::StrCat(st.applied_steps())},
      {"loss scale", absl::StrCat(st.loss_scale())},
      {"health", !st.needs_restore().empty() ? absl::StrCat("NEEDS RESTORE: ", st.needs_restore())
                 : !st.waiting_on_peer().empty()
                     ? absl::StrCat("STUCK ON A PEER: ", st.waiting_on_peer())
                     : std::string("ok")},
      {"data parallel", absl::StrCat(st.dp_world_size(), " rank(s)")},
      {"elements",
       absl::StrCat(FormatCount(static_cast<double>(st.total_elems())), " in the job; ",
                    FormatCount(static_cast<double>(st.local_elems())), " on this server, ",
                    FormatCount(static_cast<double>(st.nvme_elems())), " on NVMe")},
      {"last step", absl::StrCat("grad norm ", st.last_grad_norm(), ", lr ", st.last_lr(),
                                 st.last_skipped() ? ", skipped (overflow)" : "")},
      {"last checkpoint", st.last_checkpoint_step() < 0
                              ? std::string("none")
                              : absl::StrCat("step ", st.last_checkpoint_step())},
      {"waiting calls", absl::StrCat(st.waiting_pulls(), " pull(s) for a version to come, ",
                                     st.waiting_pushes(), " push(es) for a chunk still updating")},
      {"RAM", absl::StrCat(FormatBytes(static_cast<double>(st.ram_bytes())),
                           " for this job on this server")},
  };
  // Fields added to JobStatus after this table still show.
  constexpr int kLastFieldShown = 16;
  const auto shown_above = [](int number) {
    return number <= kLastFieldShown || (number >= v1::JobStatus::kWaitingPullsFieldNumber &&
                                         number <= v1::JobStatus::kRamBytesFieldNumber);
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
  v1::GetJobStatusRequest request;
  request.set_job(absl::GetFlag(FLAGS_job));
  v1::JobStatus status;
  grpc::ClientContext context;
  PrepareCallContext(target->call, context);
  const grpc::Status rpc = target->stub->GetJobStatus(&context, request, &status);
  if (!rpc.ok()) {
    std::cerr << "zo-ctl status: " << DescribeRpcError(*target, rpc) << "\n";
    return 1;
  }
  std::cout << (absl::GetFlag(FLAGS_json) ? MessageToJson(status).dump(2) + "\n"
                                          : FormatJobStatus(*target, status));
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

}  // namespace zo::ctl
