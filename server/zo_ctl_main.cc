// zo-ctl: the operator's command-line tool. Subcommands:
//   estimate     memory per GPU, per server RAM and per server NVMe
//   export       a checkpoint's fp32 master weights as a safetensors file
//   status       a job's state on one server (GetJobStatus)
//   checkpoint   checkpoint a job now (Checkpoint, to the lead server)
// Exit status: 0 done, 1 the operation failed (server unreachable, an RPC
// or an export failed), 2 the command line is wrong (a missing or bad flag,
// an unreadable --config, --auth-token-file or --tls-ca).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "common/command_line.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/manifest_file.h"
#include "common/sharding.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "offload/checkpoint/checkpoint_dir.h"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "rpc/call_context.h"
#include "rpc/channel.h"
#include "rpc/rpc_util.h"
#include "server/memory_estimate.h"
#include "server/safetensors_export.h"

ABSL_FLAG(std::string, params, "", "estimate: total parameter count, e.g. 13B, 350M, 7e9");
ABSL_FLAG(std::string, manifest, "",
          "estimate: model manifest JSON ({\"tensors\": [{\"name\", \"shape\"}]}) instead of "
          "--params; stages are then balanced over whole tensors");
ABSL_FLAG(int, pipeline_stages, 1, "estimate: pipeline stages per model replica");
ABSL_FLAG(int, dp, 1, "estimate: data-parallel ranks, i.e. GPUs per stage");
ABSL_FLAG(int, servers, 1, "estimate: offload servers the optimizer state is striped over");
ABSL_FLAG(std::string, precision, "fp16", "estimate: fp16 or bf16");
ABSL_FLAG(bool, nvme, false, "estimate: optimizer state (master, m, v) on NVMe");
ABSL_FLAG(std::string, chunk_elems, "4194304",
          "estimate: elements per chunk (zo.chunk_elems); counts like 4M or 1e8 work");
ABSL_FLAG(std::string, sub_group_size, "1e9",
          "estimate: elements per NVMe sub-group (zero_optimization.sub_group_size)");
ABSL_FLAG(int, buffer_count, 4, "estimate: NVMe swap buffers (offload_optimizer.buffer_count)");
ABSL_FLAG(std::string, config, "",
          "estimate: DeepSpeed-style JSON config supplying precision, NVMe offload, "
          "sub_group_size, buffer_count, chunk_elems and the server count; flags set to "
          "other than their defaults override it");
ABSL_FLAG(bool, json, false, "estimate, status, checkpoint: print JSON instead of text");
ABSL_FLAG(std::string, checkpoint, "",
          "export: a committed checkpoint directory (<root>/<job>/step-N), or a job's "
          "directory (<root>/<job>) for its latest checkpoint");
ABSL_FLAG(std::string, out, "", "export: the safetensors file to write");
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

namespace zo {
namespace {

constexpr char kUsage[] =
    "operate a zo offload deployment.\n\n"
    "usage: zo-ctl <command> [flags]\n\n"
    "commands:\n"
    "  estimate    memory per GPU, per server RAM and per server NVMe, e.g.\n"
    "              zo-ctl estimate --params 13B --pipeline-stages 4 --servers 2 --nvme\n"
    "  export      write a checkpoint's fp32 master weights as a safetensors file, e.g.\n"
    "              zo-ctl export --checkpoint /ckpt/gpt2/step-00001000 --out gpt2.safetensors\n"
    "  status      a job's state on one server, e.g.\n"
    "              zo-ctl status --server 127.0.0.1:7070 --job gpt2 [--json]\n"
    "  checkpoint  have the lead server checkpoint a job now, e.g.\n"
    "              zo-ctl checkpoint --server 127.0.0.1:7070 --job gpt2 --timeout 600\n\n"
    "status and checkpoint take --auth-token-file and --tls-ca as the servers need.\n"
    "Exit status: 0 done, 1 the operation failed, 2 a wrong command line.\n"
    "Flags may be written with dashes or underscores.";

// Sets each estimate flag still at its default from `config`, so that flags
// given on the command line win.
template <typename T>
void SetIfDefault(absl::Flag<T>& flag, const T& value) {
  const absl::CommandLineFlag& handle = absl::GetFlagReflectionHandle(flag);
  if (handle.CurrentValue() == handle.DefaultValue()) absl::SetFlag(&flag, value);
}

void ApplyConfigDefaults(const Config& config) {
  SetIfDefault(FLAGS_precision, std::string(config.bf16.enabled ? "bf16" : "fp16"));
  SetIfDefault(FLAGS_nvme,
               config.zero_optimization.offload_optimizer.device == OffloadDevice::kNvme);
  SetIfDefault(FLAGS_sub_group_size, absl::StrCat(config.zero_optimization.sub_group_size));
  SetIfDefault(FLAGS_buffer_count, config.zero_optimization.offload_optimizer.buffer_count);
  SetIfDefault(FLAGS_chunk_elems, absl::StrCat(config.zo.chunk_elems));
  if (!config.zo.servers.empty()) {
    SetIfDefault(FLAGS_servers, static_cast<int>(config.zo.servers.size()));
  }
}

absl::StatusOr<EstimateInput> EstimateInputFromFlags() {
  EstimateInput in;
  const std::string params = absl::GetFlag(FLAGS_params);
  const std::string manifest = absl::GetFlag(FLAGS_manifest);
  if (params.empty() == manifest.empty()) {
    return absl::InvalidArgumentError("give exactly one of --params and --manifest");
  }
  if (!params.empty()) {
    ZO_ASSIGN_OR_RETURN(int64_t n, ParseCount(params));
    in.tensor_elems = {n};
  } else {
    ZO_ASSIGN_OR_RETURN(std::vector<TensorSpec> specs, LoadManifestFile(manifest));
    for (const TensorSpec& t : specs) in.tensor_elems.push_back(NumElements(t.shape));
    if (in.tensor_elems.empty()) return absl::InvalidArgumentError(manifest + " has no tensors");
  }
  if (!absl::GetFlag(FLAGS_config).empty()) {
    ZO_ASSIGN_OR_RETURN(LoadedConfig loaded, LoadConfigFile(absl::GetFlag(FLAGS_config)));
    ApplyConfigDefaults(loaded.config);
  }
  const std::optional<DType> precision = ParseDType(absl::GetFlag(FLAGS_precision));
  if (!precision || *precision == DType::kFloat32) {
    return absl::InvalidArgumentError("--precision must be fp16 or bf16, got '" +
                                      absl::GetFlag(FLAGS_precision) + "'");
  }
  in.precision = *precision;
  in.pipeline_stages = absl::GetFlag(FLAGS_pipeline_stages);
  in.dp_ranks = absl::GetFlag(FLAGS_dp);
  in.servers = absl::GetFlag(FLAGS_servers);
  in.nvme = absl::GetFlag(FLAGS_nvme);
  ZO_ASSIGN_OR_RETURN(in.chunk_elems, ParseCount(absl::GetFlag(FLAGS_chunk_elems)));
  ZO_ASSIGN_OR_RETURN(in.sub_group_size, ParseCount(absl::GetFlag(FLAGS_sub_group_size)));
  in.buffer_count = absl::GetFlag(FLAGS_buffer_count);
  return in;
}

int RunEstimate() {
  absl::StatusOr<EstimateInput> in = EstimateInputFromFlags();
  absl::StatusOr<MemoryEstimate> estimate =
      in.ok() ? EstimateMemory(*in) : absl::StatusOr<MemoryEstimate>(in.status());
  if (!estimate.ok()) {
    std::cerr << "zo-ctl estimate: " << estimate.status().message() << "\n";
    return 2;
  }
  std::cout << (absl::GetFlag(FLAGS_json) ? FormatEstimateJson(*estimate)
                                          : FormatEstimateTable(*estimate));
  return 0;
}

// ---------------------------------------------------------------- export ---

// --checkpoint as given, or the latest checkpoint when it names a job's
// directory (one without a checkpoint.json of its own).
std::string ResolveCheckpointDir(const std::string& dir) {
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  if (std::ifstream(trimmed + "/checkpoint.json").good()) return trimmed;
  const size_t slash = trimmed.find_last_of('/');
  const std::string root = slash == std::string::npos ? "." : trimmed.substr(0, slash);
  const std::string job = slash == std::string::npos ? trimmed : trimmed.substr(slash + 1);
  absl::StatusOr<std::string> latest = LatestCheckpoint(root, job);
  return latest.ok() ? *latest : trimmed;  // else the export names `dir` in its error
}

int RunExport() {
  const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (checkpoint.empty() || out.empty()) {
    std::cerr << "zo-ctl export: give --checkpoint DIR and --out FILE.safetensors\n";
    return 2;
  }
  const std::string dir = ResolveCheckpointDir(checkpoint);
  int64_t count = 0;
  if (absl::StatusOr<CheckpointMeta> meta = ReadCheckpointMeta(dir); meta.ok()) {
    count = static_cast<int64_t>(meta->manifest.size());
    std::cerr << "zo-ctl export: " << dir << ": job " << meta->job << ", version " << meta->version
              << ", " << count << " tensor(s)\n";
  }
  SafetensorsExportOptions options;
  options.progress = [count](int64_t t, const std::string& name) {
    std::cerr << "zo-ctl export: [" << t + 1 << "/" << count << "] " << name << "\n";
  };
  absl::StatusOr<SafetensorsExportSummary> summary = ExportMasterToSafetensors(dir, out, options);
  if (!summary.ok()) {
    std::cerr << "zo-ctl export: " << summary.status().message() << "\n";
    return 1;
  }
  std::cout << "exported " << summary->tensors << " tensor(s), " << summary->bytes << " bytes ("
            << FormatBytes(static_cast<double>(summary->bytes)) << ") to " << out << "\n";
  return 0;
}

// ------------------------------------------------------------------- RPCs ---

// What a status or checkpoint call needs besides its request.
struct RpcTarget {
  std::string server;
  std::unique_ptr<zo::v1::Offload::Stub> stub;
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

// Every field of a message, scalars as JSON numbers, strings and booleans
// (int64 stays a number, unlike protobuf's own JSON mapping).
nlohmann::ordered_json MessageToJson(const google::protobuf::Message& msg) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Descriptor* d = msg.GetDescriptor();
  const google::protobuf::Reflection* r = msg.GetReflection();
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    auto value = [&](int index) -> nlohmann::ordered_json {
      const bool rep = f->is_repeated();
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_INT32:
          return rep ? r->GetRepeatedInt32(msg, f, index) : r->GetInt32(msg, f);
        case FieldDescriptor::CPPTYPE_INT64:
          return rep ? r->GetRepeatedInt64(msg, f, index) : r->GetInt64(msg, f);
        case FieldDescriptor::CPPTYPE_UINT32:
          return rep ? r->GetRepeatedUInt32(msg, f, index) : r->GetUInt32(msg, f);
        case FieldDescriptor::CPPTYPE_UINT64:
          return rep ? r->GetRepeatedUInt64(msg, f, index) : r->GetUInt64(msg, f);
        case FieldDescriptor::CPPTYPE_DOUBLE:
          return rep ? r->GetRepeatedDouble(msg, f, index) : r->GetDouble(msg, f);
        case FieldDescriptor::CPPTYPE_FLOAT:
          return rep ? r->GetRepeatedFloat(msg, f, index) : r->GetFloat(msg, f);
        case FieldDescriptor::CPPTYPE_BOOL:
          return rep ? r->GetRepeatedBool(msg, f, index) : r->GetBool(msg, f);
        case FieldDescriptor::CPPTYPE_STRING:
          return rep ? r->GetRepeatedString(msg, f, index) : r->GetString(msg, f);
        case FieldDescriptor::CPPTYPE_ENUM:
          return (rep ? r->GetRepeatedEnum(msg, f, index) : r->GetEnum(msg, f))->name();
        case FieldDescriptor::CPPTYPE_MESSAGE:
          return MessageToJson(rep ? r->GetRepeatedMessage(msg, f, index) : r->GetMessage(msg, f));
      }
      return nullptr;
    };
    if (f->is_repeated()) {
      nlohmann::ordered_json items = nlohmann::ordered_json::array();
      for (int k = 0; k < r->FieldSize(msg, f); ++k) items.push_back(value(k));
      j[f->name()] = std::move(items);
    } else {
      j[f->name()] = value(0);
    }
  }
  return j;
}

std::string FormatJobStatus(const RpcTarget& target, const zo::v1::JobStatus& st) {
  std::vector<std::pair<std::string, std::string>> rows = {
      {"version",
       absl::StrCat(st.version(), " (gradients are pushed for step ", st.open_step(), ")")},
      {"applied steps", absl::StrCat(st.applied_steps())},
      {"loss scale", absl::StrCat(st.loss_scale())},
      {"health",
       st.needs_restore().empty() ? "ok" : absl::StrCat("NEEDS RESTORE: ", st.needs_restore())},
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
  };
  // Fields added to JobStatus after this table (numbers past 16) still show.
  constexpr int kLastFieldShown = 16;
  const nlohmann::ordered_json all = MessageToJson(st);
  const google::protobuf::Descriptor* d = st.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    if (d->field(i)->number() <= kLastFieldShown) continue;
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

int RunStatus() {
  absl::StatusOr<RpcTarget> target = RpcTargetFromFlags();
  if (!target.ok()) {
    std::cerr << "zo-ctl status: " << target.status().message() << "\n";
    return 2;
  }
  zo::v1::GetJobStatusRequest request;
  request.set_job(absl::GetFlag(FLAGS_job));
  zo::v1::JobStatus status;
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
  zo::v1::CheckpointRequest request;
  request.set_job(absl::GetFlag(FLAGS_job));
  zo::v1::CheckpointResponse response;
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

int Main(int argc, char** argv) {
  SetUsage(kUsage, "server/zo_ctl_main");
  std::vector<std::string> storage;
  std::vector<char*> args = NormalizeFlagNames(argc, argv, storage);
  std::vector<char*> positional = absl::ParseCommandLine(argc, args.data());
  if (positional.size() != 2) {
    std::cerr << "zo-ctl: " << absl::ProgramUsageMessage() << "\n";
    return 2;
  }
  const std::string command = positional[1];
  if (command == "estimate") return RunEstimate();
  if (command == "export") return RunExport();
  if (command == "status") return RunStatus();
  if (command == "checkpoint") return RunCheckpoint();
  std::cerr << "zo-ctl: unknown command '" << command << "'; try zo-ctl --help\n";
  return 2;
}

}  // namespace
}  // namespace zo

int main(int argc, char** argv) { return zo::Main(argc, argv); }
