// OffloadClient::Open: connect, open or attach to the job on every server,
// and take on its state.
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "rpc/channel.h"
#include "rpc/proto_convert.h"
#include "worker/client/internal/call.h"
#include "worker/client/internal/offload_client_impl.h"
#include "worker/client/internal/setup.h"
#include "worker/client/offload_client.h"

namespace zo {
namespace {

using client_internal::CallGroup;
using client_internal::JobDType;
using client_internal::RunInParallel;
using client_internal::ValidateOptions;

// Opens of a job that is being restored meanwhile, before Open gives up
// (UNAVAILABLE); about half a minute with the pauses between them.
constexpr int kOpenAttempts = 40;

// INVALID_ARGUMENT naming the first tensor of `manifest` that is not of the
// job's dtype (`reason`: why the job has it).
absl::Status CheckManifestDType(const std::vector<TensorSpec>& manifest, DType dtype,
                                const char* reason) {
  for (const TensorSpec& t : manifest) {
    if (t.dtype != dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' of the manifest is ", std::string(DTypeName(t.dtype)),
          ", but the job's dtype is ", std::string(DTypeName(dtype)), " (", reason, ")"));
    }
  }
  return absl::OkStatus();
}

// The job's servers: per server, its name, the channel to it and the
// `connections` - 1 more that only its pushes and pulls take.
struct Servers {
  std::vector<std::string> names;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::vector<std::shared_ptr<grpc::Channel>>> more_channels;
};

// The channels the options give, named "inproc:<i>", or `connections` to
// each address they list (a channel is a TCP connection of its own,
// NewChannel; none is made before its first call).
absl::StatusOr<Servers> Connect(const ClientOptions& options, int64_t connections) {
  Servers servers;
  servers.channels = options.channels;
  if (!servers.channels.empty()) {
    for (size_t i = 0; i < servers.channels.size(); ++i) {
      servers.names.push_back(absl::StrCat("inproc:", i));
    }
    return servers;
  }
  servers.names = options.servers;
  for (const std::string& address : servers.names) {
    ZO_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                        NewChannel(address, {.tls_root_certs = options.tls_root_certs}));
    servers.channels.push_back(std::move(channel));
    servers.more_channels.emplace_back();
    for (int64_t c = 1; c < connections; ++c) {
      ZO_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> more,
                          NewChannel(address, {.tls_root_certs = options.tls_root_certs}));
      servers.more_channels.back().push_back(std::move(more));
    }
  }
  return servers;
}

}  // namespace

absl::StatusOr<bool> OffloadClient::Impl::SameInstanceAsOpened(
    const std::vector<v1::OpenJobResponse>& replies) {
  std::vector<v1::JobStatus> now(replies.size());
  CallGroup group;
  ZO_RETURN_IF_ERROR(RunInParallel(replies.size(), group, [&](size_t i) -> absl::Status {
    v1::GetJobStatusRequest request;
    request.set_job(options.job);
    ZO_ASSIGN_OR_RETURN(now[i], Unary<v1::JobStatus>(
                                    static_cast<int>(i),
                                    [&](v1::Offload::Stub& stub, grpc::ClientContext& context,
                                        v1::JobStatus& status) {
                                      return stub.GetJobStatus(&context, request, &status);
                                    },
                                    &group));
    return absl::OkStatus();
  }));
  if (now[0].restoring()) return false;  // a rollback under way
  for (size_t i = 0; i < replies.size(); ++i) {
    if (now[i].incarnation() != replies[i].status().incarnation()) return false;
  }
  return true;
}

absl::Status OffloadClient::Impl::OpenJobOnEveryServer(const std::string& config_json,
                                                       const v1::Manifest& manifest,
                                                       std::vector<v1::OpenJobResponse>& replies) {
  // In parallel: a server's OpenJob may wait for the others of the job.
  CallGroup group;
  client_internal::CallSettings settings = call;
  settings.retry_for = options.open_retry_for.value_or(options.retry_for);
  return RunInParallel(names.size(), group, [&](size_t i) -> absl::Status {
    v1::OpenJobRequest request;
    request.set_job(options.job);
    *request.mutable_manifest() = manifest;
    request.set_config_json(config_json);
    request.set_dp_world_size(options.dp_world_size);
    for (const std::string& name : names) request.add_servers(name);
    request.set_server_index(static_cast<int>(i));
    request.set_attach_only(options.attach_only);
    request.set_init_fingerprint(options.init_fingerprint);
    ZO_ASSIGN_OR_RETURN(replies[i], Unary<v1::OpenJobResponse>(
                                        settings, static_cast<int>(i),
                                        [&](v1::Offload::Stub& stub, grpc::ClientContext& context,
                                            v1::OpenJobResponse& response) {
                                          return stub.OpenJob(&context, request, &response);
                                        },
                                        &group));
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<v1::OpenJobResponse>> OffloadClient::Impl::OpenJob(
    const std::string& config_json, const v1::Manifest& manifest) {
  std::vector<v1::OpenJobResponse> replies(names.size());
  for (int attempt = 1;; ++attempt) {
    ZO_RETURN_IF_ERROR(OpenJobOnEveryServer(config_json, manifest, replies));
    // One server's open may have been retried until the lead rolled the job
    // back onto it (it restarted), while the others answered before: their
    // answers are of the instance the rollback replaced, and this client
    // would wait forever for a version that instance had reached.
    ZO_ASSIGN_OR_RETURN(const bool settled, SameInstanceAsOpened(replies));
    if (settled) return replies;
    if (attempt == kOpenAttempts) {
      return absl::UnavailableError(absl::StrCat("job ", options.job, " was restored ",
                                                 kOpenAttempts,
                                                 " times while this worker opened it; try again"));
    }
    ZO_LOG(INFO) << "job " << options.job << " was restored while this worker opened it; "
                 << "opening it again";
    absl::SleepFor(std::min(absl::Milliseconds(50) * attempt, absl::Seconds(1)));
  }
}

void OffloadClient::Impl::TakeOnOpened(const std::vector<v1::OpenJobResponse>& replies) {
  const int num_servers = static_cast<int>(names.size());
  const v1::JobStatus& lead = replies[0].status();
  SetStatus(lead);
  incarnation = std::make_unique<std::atomic<uint64_t>[]>(num_servers);
  for (int i = 0; i < num_servers; ++i) incarnation[i] = replies[i].status().incarnation();
  for (int i = 0; i < num_servers; ++i) pull_stripes[i] = replies[i].pull_stripes();
  // Servers given by address may be on this host: the same-host route.
  if (options.shared_memory && options.channels.empty()) AttachRegions();
  for (int i = 0; i < num_servers; ++i) {
    const size_t connections = data_channels[i].size();
    if (connections > 1 && DataOverGrpc(i)) {
      ZO_LOG(INFO) << "server " << names[i] << ": gradients and weights over gRPC on "
                   << connections << " TCP connections (zo.connections_per_server)"
                   << (pull_stripes[i] ? ""
                                       : "; its pulls on one (it is older than striped pulls)");
    }
  }
  RefuseStepsIfStateLost(replies);
  ZO_LOG(INFO) << (replies[0].attached() ? "attached to" : "opened") << " job " << options.job
               << " on " << num_servers << " server(s) at version " << lead.version()
               << " as dp rank " << options.dp_rank << " of " << options.dp_world_size;
  if (!lead.needs_restore().empty()) {
    ZO_LOG(WARNING) << "job " << options.job << " needs a restore: " << lead.needs_restore();
  }
}

void OffloadClient::Impl::RefuseStepsIfStateLost(const std::vector<v1::OpenJobResponse>& replies) {
  // A server that opened the job fresh while another holds it trained has
  // restarted and lost its part: training on would mix version 0 with the
  // others' state. Refuse every step until the job is restored.
  const int num_servers = static_cast<int>(names.size());
  int trained = -1;
  for (int i = 0; i < num_servers; ++i) {
    if (replies[i].attached() && replies[i].status().version() > 0) trained = i;
  }
  for (int i = 0; trained >= 0 && i < num_servers; ++i) {
    if (replies[i].attached()) continue;
    lost_state = absl::StrCat(
        "job '", options.job, "' is at version ", replies[trained].status().version(), " on ",
        names[trained], " but ", names[i], " (server ", i,
        ") holds nothing of it: it restarted and lost its part. Restore the job from a "
        "checkpoint before training on (zo-train --restore latest, zo.torch's "
        "load_checkpoint, or OffloadClient::Restore)");
    ZO_LOG(ERROR) << lost_state;
    break;
  }
}

absl::StatusOr<std::unique_ptr<OffloadClient>> OffloadClient::Open(
    const ClientOptions& options, const std::string& config_json,
    std::vector<TensorSpec> manifest) {
  ZO_ASSIGN_OR_RETURN(LoadedConfig loaded,
                      ParseConfig(config_json, {.dp_world_size = options.dp_world_size}));
  if (loaded.config.zo.dpu.compensation != DpuCompensation::kNone &&
      !options.applies_dpu_compensation) {
    // A job that says so must not train without it.
    return absl::InvalidArgumentError(absl::StrCat(
        "zo.dpu.compensation \"", std::string(EnumName(loaded.config.zo.dpu.compensation)),
        "\": this worker does not apply it (zo-train does; zo.torch computes on the "
        "version served); leave it \"none\""));
  }
  const auto [dtype, dtype_reason] = JobDType(loaded.config);
  ZO_RETURN_IF_ERROR(ValidateOptions(options, static_cast<int64_t>(DTypeSize(dtype))));
  ZO_RETURN_IF_ERROR(CheckManifestDType(manifest, dtype, dtype_reason));
  const v1::Manifest wire_manifest = ManifestToProto(manifest);
  ZO_ASSIGN_OR_RETURN(Servers servers, Connect(options, loaded.config.zo.connections_per_server));
  ZO_ASSIGN_OR_RETURN(ShardMap map,
                      ShardMap::Create(std::move(manifest), loaded.config.zo.chunk_elems,
                                       static_cast<int>(servers.channels.size())));
  auto impl = std::make_unique<Impl>(options, std::move(loaded.config), dtype, std::move(map),
                                     std::move(servers.names), std::move(servers.channels),
                                     std::move(servers.more_channels), options.routes);
  ZO_ASSIGN_OR_RETURN(const std::vector<v1::OpenJobResponse> replies,
                      impl->OpenJob(config_json, wire_manifest));
  impl->TakeOnOpened(replies);
  return std::unique_ptr<OffloadClient>(new OffloadClient(std::move(impl)));
}

}  // namespace zo
