// zo-server: hosts offload jobs (docs/architecture.md, "One training step"). Workers
// and other servers reach it over gRPC; SIGTERM or SIGINT stop it gracefully.
#include <csignal>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/command_line.h"
#include "common/logging.h"
#include "common/malloc_tuning.h"
#include "common/units.h"
#include "server/offload_server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "address to listen on; loopback by default, 0.0.0.0:PORT for every interface, port 0 "
          "picks a free one");
ABSL_FLAG(int, threads, 0, "optimizer threads (0: one per core)");
ABSL_FLAG(std::string, memory_budget, "",
          "bytes of optimizer state (12 per parameter) each job may keep in RAM, e.g. 64Gi; "
          "beyond it NVMe offload is required (0: all of it on NVMe). Empty: no limit");
ABSL_FLAG(std::string, nvme_path, "",
          "directory for NVMe swap files; overrides the job config's offload_optimizer.nvme_path");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "directory checkpoints are written to (shared by every server of a job); empty: "
          "checkpoints are refused");
ABSL_FLAG(int, keep_checkpoints, 0,
          "after each checkpoint the lead removes the job's older ones beyond the newest N; "
          "0: keeps them all");
ABSL_FLAG(int, max_jobs, 64,
          "jobs this server holds at once; opening one more is refused (RESOURCE_EXHAUSTED)");
ABSL_FLAG(std::string, auth_token_file, "",
          "file holding the shared token every zo.v1 call must carry (also used to call peers); "
          "the gRPC health service and reflection answer without it");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve TLS (needs --tls-key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls-cert");
ABSL_FLAG(std::string, tls_ca, "", "PEM root certificates to verify peer servers with");
ABSL_FLAG(std::string, max_message_bytes, "64Mi", "largest message accepted");
ABSL_FLAG(int, log_every, 0, "steps between step log lines (0: the job's steps_per_print)");
ABSL_FLAG(std::string, port_file, "", "write the bound port to this file once listening");
ABSL_FLAG(bool, shared_memory, true,
          "map the shared-memory regions of workers on this host, so their gradients and "
          "weights skip the socket (the same-host route); false: they use gRPC");
ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus metrics (GET /metrics) on this host:port, e.g. 0.0.0.0:9400; port 0 "
          "picks a free one (the log says which); empty: no metrics endpoint");
ABSL_FLAG(absl::Duration, inject_nvme_latency, absl::ZeroDuration(),
          "testing: every NVMe swap read and write takes at least this long, e.g. 20ms (a slow "
          "disk, for soak tests); 0: off");

namespace zo {
namespace {

constexpr char kUsage[] =
    "hosts zo offload jobs: fp32 master weights, Adam state (RAM or NVMe), step\n"
    "coordination, checkpoints.\n\n"
    "usage: zo-server [--listen 127.0.0.1:7070] [--threads N] [--memory-budget 64Gi]\n"
    "                 [--nvme-path DIR] [--checkpoint-dir DIR [--keep-checkpoints N]]\n"
    "                 [--auth-token-file F]\n"
    "                 [--tls-cert F --tls-key F] [--tls-ca F] [--metrics-listen ADDR]\n\n"
    "Stops gracefully on SIGTERM or SIGINT. Flags may be written with dashes or underscores.";

int Run() {
  ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.nvme_path = absl::GetFlag(FLAGS_nvme_path);
  options.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  options.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  options.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  options.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  options.log_every = absl::GetFlag(FLAGS_log_every);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.inject_nvme_latency = absl::GetFlag(FLAGS_inject_nvme_latency);
  auto fail = [](const absl::Status& s) {
    std::cerr << "zo-server: " << s.message() << "\n";
    return 2;
  };
  if (options.threads < 0) return fail(absl::InvalidArgumentError("--threads must be >= 0"));
  if (const std::string b = absl::GetFlag(FLAGS_memory_budget); !b.empty()) {
    absl::StatusOr<int64_t> budget = ParseBytes("memory-budget", b);  // 0: all of it on NVMe
    if (!budget.ok()) return fail(budget.status());
    options.memory_budget_bytes = *budget;
  }
  absl::StatusOr<int64_t> max_message =
      ParseBytes("max-message-bytes", absl::GetFlag(FLAGS_max_message_bytes));
  if (!max_message.ok()) return fail(max_message.status());
  if (*max_message < 4096 || *max_message > (int64_t{1} << 30)) {
    return fail(absl::InvalidArgumentError("--max-message-bytes must be in [4Ki, 1Gi]"));
  }
  options.max_message_bytes = *max_message;
  if (const std::string f = absl::GetFlag(FLAGS_auth_token_file); !f.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile("auth-token-file", f);
    if (!token.ok()) return fail(token.status());
    options.auth_token = *std::move(token);
  }
  for (auto [flag, name, dst] : {std::tuple{&FLAGS_tls_cert, "tls-cert", &options.tls_cert},
                                 std::tuple{&FLAGS_tls_key, "tls-key", &options.tls_key},
                                 std::tuple{&FLAGS_tls_ca, "tls-ca", &options.tls_root_certs}}) {
    if (const std::string f = absl::GetFlag(*flag); !f.empty()) {
      absl::StatusOr<std::string> pem = ReadFlagFile(name, f);
      if (!pem.ok()) return fail(pem.status());
      *dst = *std::move(pem);
    }
  }

  // Signals are taken by sigwait below, not by whichever thread they hit.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<OffloadServer>> server = OffloadServer::Start(options);
  if (!server.ok()) return fail(server.status());
  if (const std::string f = absl::GetFlag(FLAGS_port_file); !f.empty()) {
    const std::string tmp = f + ".tmp";
    std::ofstream(tmp) << (*server)->port() << "\n";
    std::rename(tmp.c_str(), f.c_str());
  }
  int signal = 0;
  sigwait(&signals, &signal);
  ZO_LOG(INFO) << "zo-server: " << (signal == SIGTERM ? "SIGTERM" : "SIGINT") << ", shutting down";
  (*server)->Shutdown(absl::Seconds(5));
  return 0;
}

}  // namespace
}  // namespace zo

int main(int argc, char** argv) {
  zo::TuneMallocForBulkMessages();
  std::vector<std::string> storage;
  zo::ParseFlags(argc, argv, zo::kUsage, "server/zo_server_main.cc", storage);
  return zo::Run();
}
