#include "server/offload_server.h"

#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/logging.h"
#include "common/metrics_endpoint.h"
#include "common/status_macros.h"
#include "common/wake_queue.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "offload/thread_pool.h"
#include "rpc/channel.h"
#include "server/embedded_route.h"
#include "server/job_registry.h"
#include "server/offload_service.h"
#include "server/peer_client.h"
#include "server/server_metrics.h"
#include "server/shared_regions.h"
#include "server/startup_checks.h"

namespace zo {

struct OffloadServer::Impl {
  ServerOptions options;
  std::unique_ptr<ThreadPool> pool;
  // Outlives the registry and the server: waiting calls finish through it.
  std::unique_ptr<WakeQueue> wakes;
  std::unique_ptr<PeerClient> peers;
  std::unique_ptr<JobRegistry> registry;
  std::unique_ptr<SharedRegions> regions;
  // Detached by Shutdown, before the registry goes; clients may hold it longer.
  std::shared_ptr<EmbeddedRoute> route;
  // Outlives the server: its interceptors count into it.
  std::shared_ptr<ServerMetrics> metrics;
  std::unique_ptr<OffloadService> service;
  std::unique_ptr<grpc::Server> server;
  // Destroyed first: no scrape reads a job being torn down.
  std::unique_ptr<MetricsEndpoint> metrics_endpoint;
  int port = 0;
  std::once_flag shutdown_once;
};

OffloadServer::OffloadServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<OffloadServer>> OffloadServer::Start(const ServerOptions& options) {
  SeeConnectsPromptly();  // before gRPC starts: its peer calls reconnect too
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("TLS needs both a certificate and a key");
  }
  if (!options.listen.empty()) {
    ZO_RETURN_IF_ERROR(ParseHostPort(options.listen, PortUse::kListen).status());
  }
  if (!options.checkpoint_dir.empty()) {
    ZO_RETURN_IF_ERROR(CheckCheckpointDir(options.checkpoint_dir, "--checkpoint-dir"));
  }
  if (options.keep_checkpoints < 0) {
    return absl::InvalidArgumentError("--keep-checkpoints must be >= 0 (0: keep all)");
  }
  if (options.max_jobs < 1) return absl::InvalidArgumentError("--max-jobs must be >= 1");
  if (!options.nvme_path.empty()) {
    ZO_RETURN_IF_ERROR(CheckNvmeDir(options.nvme_path, "--nvme-path"));
  }
  if (!options.metrics_listen.empty()) {
    ZO_RETURN_IF_ERROR(ParseHostPort(options.metrics_listen, PortUse::kListen).status());
  }
  if (options.inject_nvme_latency < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--inject-nvme-latency must be >= 0");
  }
  if (options.inject_nvme_latency > absl::ZeroDuration()) {
    ZO_LOG(WARNING) << "every NVMe swap read and write is slowed to at least "
                    << options.inject_nvme_latency << " (--inject-nvme-latency: for testing)";
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->pool = std::make_unique<ThreadPool>(options.threads);
  impl->wakes = std::make_unique<WakeQueue>();
  impl->peers = std::make_unique<PeerClient>(
      PeerCredentials{.auth_token = options.auth_token, .tls_root_certs = options.tls_root_certs});
  impl->registry = std::make_unique<JobRegistry>(JobResources{
      .pool = impl->pool.get(),
      .peers = impl->peers.get(),
      .wakes = impl->wakes.get(),
      .nvme_root = options.nvme_path,
      .ram_budget_bytes = options.memory_budget_bytes,
      .checkpoint_root = options.checkpoint_dir,
      .keep_checkpoints = options.keep_checkpoints,
      .log_every = options.log_every,
      .max_jobs = options.max_jobs,
      .available_ram = {},  // /proc/meminfo
      .nvme_latency = options.inject_nvme_latency,
      .speculated = options.test_speculated,
      .applying = {},
      .committing = options.test_committing,
  });
  impl->route = std::make_shared<EmbeddedRoute>(impl->registry.get());
  impl->metrics = std::make_shared<ServerMetrics>(impl->registry.get());
  impl->regions = std::make_unique<SharedRegions>(options.shared_memory);
  impl->service = std::make_unique<OffloadService>(impl->registry.get(), impl->regions.get(),
                                                   options.auth_token, options.max_message_bytes);

  if (!options.metrics_listen.empty()) {
    ZO_ASSIGN_OR_RETURN(impl->metrics_endpoint,
                        MetricsEndpoint::Start(options.metrics_listen, {impl->metrics}));
    ZO_LOG(INFO) << "zo-server metrics at " << impl->metrics_endpoint->url();
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!options.listen.empty()) {
    std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
    if (!options.tls_cert.empty()) {
      grpc::SslServerCredentialsOptions ssl;
      ssl.pem_key_cert_pairs.push_back({options.tls_key, options.tls_cert});
      creds = grpc::SslServerCredentials(ssl);
    }
    builder.AddListeningPort(options.listen, creds, &impl->port);
  }
  // gRPC sets SO_REUSEPORT by default: a second zo-server on the same port
  // would start and take half the connections. Without it, its bind fails.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Clients ping while they wait (rpc/pings.h); take their pings.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             PingArgMs(options.accept_pings_every));
  builder.RegisterService(impl->service.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(impl->metrics->CallCounter());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || (!options.listen.empty() && impl->port == 0)) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen,
                     " (address in use, another zo-server there?, or not a local address)"));
  }
  grpc::HealthCheckServiceInterface* health = impl->server->GetHealthCheckService();
  if (health != nullptr) health->SetServingStatus(true);
  ZO_LOG(INFO) << "zo-server listening on "
               << (options.listen.empty()
                       ? std::string("in-process only")
                       : absl::StrCat(options.listen, " (port ", impl->port, ")"))
               << (options.tls_cert.empty() ? "" : ", TLS")
               << (options.auth_token.empty() ? "" : ", token required") << ", "
               << impl->pool->size() << " optimizer threads";
  return std::unique_ptr<OffloadServer>(new OffloadServer(std::move(impl)));
}

OffloadServer::~OffloadServer() { Shutdown(absl::ZeroDuration()); }

int OffloadServer::port() const { return impl_->port; }

int OffloadServer::metrics_port() const {
  return impl_->metrics_endpoint == nullptr ? 0 : impl_->metrics_endpoint->port();
}

std::shared_ptr<grpc::Channel> OffloadServer::InProcessChannel() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(impl_->options.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(impl_->options.max_message_bytes));
  return impl_->server->InProcessChannel(args);
}

std::shared_ptr<InProcessRoute> OffloadServer::DataRoute() { return impl_->route; }

void OffloadServer::Shutdown(absl::Duration grace) {
  std::call_once(impl_->shutdown_once, [&] {
    grpc::HealthCheckServiceInterface* health = impl_->server->GetHealthCheckService();
    if (health != nullptr) health->SetServingStatus(false);
    impl_->metrics_endpoint.reset();
    impl_->registry->StopAll();  // posts the wakes of every call waiting on a job
    impl_->wakes->Drain();       // those calls have finished, naming the shutdown
    impl_->route->Detach();
    impl_->server->Shutdown(absl::ToChronoTime(absl::Now() + grace));
    ZO_LOG(INFO) << "zo-server stopped";
  });
}

void OffloadServer::Wait() { impl_->server->Wait(); }

}  // namespace zo
