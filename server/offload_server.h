// A running zo-server: the gRPC server with the offload service, the
// standard health service and server reflection, on a TCP port and/or
// in-process (the embedded default of zo-train and the tests: a channel with
// no socket, the same protocol).
//
//   ZO_ASSIGN_OR_RETURN(auto server, OffloadServer::Start({.listen = "127.0.0.1:0"}));
//   std::cout << server->port();
//   server->Shutdown(absl::Seconds(5));
#ifndef ZO_SERVER_OFFLOAD_SERVER_H_
#define ZO_SERVER_OFFLOAD_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rpc/pings.h"

namespace grpc {
class Channel;
class Server;
}  // namespace grpc

namespace zo {

class InProcessRoute;

struct ServerOptions {
  // "host:port"; port 0 picks a free one; empty: in-process only.
  std::string listen = "127.0.0.1:7070";
  int threads = 0;  // optimizer threads; 0: one per core
  // Bytes of optimizer state each job may keep in RAM; < 0: no limit.
  int64_t memory_budget_bytes = -1;
  std::string nvme_path;       // overrides the config's nvme_path
  std::string checkpoint_dir;  // empty: checkpoints refused
  int keep_checkpoints = 0;    // per job, the newest kept after each checkpoint; 0: all
  int max_jobs = 64;           // jobs held at once; more opens are RESOURCE_EXHAUSTED
  std::string auth_token;      // empty: no token checked
  // PEM contents. cert + key: the port speaks TLS. root_certs: how this
  // server checks its peers' certificates when it calls them.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_root_certs;
  int64_t max_message_bytes = int64_t{64} << 20;
  int log_every = 0;  // steps between step log lines; 0: the job's steps_per_print
  // "host:port" of the Prometheus endpoint (port 0 picks one); empty: none.
  std::string metrics_listen;
  // Map the shared-memory regions of workers on this host (the same-host
  // route); false: they push and pull over gRPC.
  bool shared_memory = true;
  // Pings a client may send without data between them (rpc/channel.h);
  // more often is answered with GOAWAY "too_many_pings" after two.
  absl::Duration accept_pings_every = kPingsAcceptedEvery;
  // Testing: every NVMe swap read and write takes at least this long.
  absl::Duration inject_nvme_latency;
  // Tests: every job's step hooks (JobResources::speculated, committing).
  std::function<void(int64_t step, int64_t chunks)> test_speculated;
  std::function<void(int64_t step)> test_committing;
};

class OffloadServer {
 public:
  static absl::StatusOr<std::unique_ptr<OffloadServer>> Start(const ServerOptions& options);
  ~OffloadServer();  // Shutdown(0)

  // The bound port (0 when in-process only).
  int port() const;
  // The metrics endpoint's port (0 without one).
  int metrics_port() const;
  // A channel to this server that uses no socket.
  std::shared_ptr<grpc::Channel> InProcessChannel();
  // The data plane's in-process route to this server's jobs
  // (rpc/in_process_route.h): pushes and pulls without gRPC, for a client
  // in this process beside InProcessChannel(), which still carries the control calls. UNAVAILABLE
  // after Shutdown.
  std::shared_ptr<InProcessRoute> DataRoute();
  // Stops the jobs, then lets calls in flight finish for up to `grace`.
  void Shutdown(absl::Duration grace);
  // Blocks until Shutdown.
  void Wait();

 private:
  struct Impl;
  explicit OffloadServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zo

#endif  // ZO_SERVER_OFFLOAD_SERVER_H_
