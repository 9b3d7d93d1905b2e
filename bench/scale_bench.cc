#include "bench/scale_bench.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "bench/internal/bench_stats.h"
#include "bench/internal/fork_check.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/fp16.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "tests/cluster/netns_hosts.h"
#include "tests/cluster/server_host.h"
#include "worker/client/offload_client.h"

namespace zo::bench {
namespace {

using bench_internal::Median;
using bench_internal::SecondsSince;

std::string ServerBinary(const ScaleBenchOptions& o) {
  if (!o.server_binary.empty()) return o.server_binary;
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  return (self.parent_path() / "zo-server").string();
}

// Finite, varied fp16 values: a step the servers apply, never skip.
std::shared_ptr<const std::vector<uint16_t>> MakeGradient(int64_t elems) {
  auto g = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(elems));
  uint32_t x = 2024;
  for (uint16_t& h : *g) {
    x = x * 1664525u + 1013904223u;
    h = FloatToHalfBits(static_cast<float>(static_cast<int>(x >> 22) - 512) * 1e-5f);
  }
  return g;
}

std::string JobConfig(const ScaleBenchOptions& o, int connections) {
  const nlohmann::json config = {
      {"train_batch_size", 1},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}},
      {"gradient_clipping", 1.0},
      {"fp16", {{"enabled", true}}},
      {"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}}},
      {"zo",
       {{"chunk_elems", o.chunk_elems},
        {"connections_per_server", connections},
        {"dpu", {{"enabled", o.dpu}, {"warmup_steps", 0}}}}},
  };
  return config.dump();
}

// The worker's steps, in the worker host's namespace: one warm-up step (the
// connections, HTTP/2 windows, the servers' first touch of their state),
// then `rounds` timed ones of push, acknowledgement and pull.
absl::StatusOr<std::vector<double>> WorkerSteps(const ScaleBenchOptions& o,
                                                const std::vector<std::string>& servers,
                                                const std::string& job, int connections) {
  ClientOptions options;
  options.job = job;
  options.servers = servers;
  // The namespaces stand for other machines: their servers would offer
  // the same-host route, whose bytes never cross the capped links.
  options.shared_memory = false;
  std::vector<TensorSpec> manifest = {{.name = "w", .shape = {o.params}, .dtype = DType::kFloat16}};
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<OffloadClient> client,
                      OffloadClient::Open(options, JobConfig(o, connections), std::move(manifest)));
  const std::shared_ptr<const std::vector<uint16_t>> grad = MakeGradient(o.params);
  const auto data = absl::MakeConstSpan(reinterpret_cast<const std::byte*>(grad->data()),
                                        static_cast<size_t>(o.params * 2));
  std::vector<std::byte> weights(static_cast<size_t>(o.params * 2));
  const std::vector<absl::Span<std::byte>> dst = {absl::MakeSpan(weights)};
  const int tensors[] = {0};
  std::vector<double> step_s;
  for (int step = 1; step <= o.rounds + 1; ++step) {
    const auto start = std::chrono::steady_clock::now();
    ZO_RETURN_IF_ERROR(client->PushShared(step, 0, grad, data));
    ZO_RETURN_IF_ERROR(client->FinishStep(step));
    // Without DPU step t + 1 computes on v(t); with it, on v(t - 1).
    const int64_t version = o.dpu ? step - 1 : step;
    ZO_RETURN_IF_ERROR(client->Pull(version, version - 1, tensors, dst).status());
    if (step > 1) step_s.push_back(SecondsSince(start));
    std::cerr << absl::StrFormat("scale: %d server(s), %d connection(s) each, step %d: %.3f s\n",
                                 servers.size(), connections, step, SecondsSince(start));
  }
  return step_s;
}

// Forks the worker into namespace `netns`; its step times come back on a
// pipe as text ("ok t1 t2 ..." or "error <message>").
absl::StatusOr<std::vector<double>> RunWorker(const ScaleBenchOptions& o, const std::string& netns,
                                              const std::vector<std::string>& servers,
                                              const std::string& job, int connections) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    close(fds[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    std::string report;
    const int ns = open(("/run/netns/" + netns).c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) {
      report = absl::StrCat("error entering ", netns, ": ", strerror(errno));
    } else {
      absl::StatusOr<std::vector<double>> steps = WorkerSteps(o, servers, job, connections);
      report = steps.ok() ? absl::StrCat("ok ", absl::StrJoin(*steps, " "))
                          : absl::StrCat("error ", steps.status().message());
    }
    (void)!write(fds[1], report.data(), report.size());
    _exit(0);  // no destructors: gRPC's threads exist only in this child
  }
  close(fds[1]);
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) text.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  waitpid(pid, nullptr, 0);
  if (text.rfind("ok", 0) != 0) {
    return absl::InternalError(text.empty() ? "the worker died" : text.substr(6));
  }
  std::istringstream in(text.substr(2));
  std::vector<double> steps;
  for (double s; in >> s;) steps.push_back(s);
  return steps;
}

}  // namespace

absl::Status ValidateScaleBenchOptions(const ScaleBenchOptions& o) {
  if (o.servers.empty())
    return absl::InvalidArgumentError("--server-hosts: name at least one count");
  for (int k : o.servers) {
    if (k < 1 || k > 64) {
      return absl::InvalidArgumentError(absl::StrCat("--server-hosts: counts 1..64, got ", k));
    }
  }
  if (o.link_mbit < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--link-mbit must be >= 0 (0: uncapped), got ", o.link_mbit));
  }
  if (o.connections.empty()) {
    return absl::InvalidArgumentError("--connections: name at least one count");
  }
  for (int c : o.connections) {
    if (c < 1 || c > ZoConfig::kMaxConnectionsPerServer) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--connections: counts 1..", ZoConfig::kMaxConnectionsPerServer, ", got ", c));
    }
  }
  if (o.params < 1 || o.chunk_elems < 1 || o.rounds < 1) {
    return absl::InvalidArgumentError("--params, --chunk-elems and --rounds must be positive");
  }
  return absl::OkStatus();
}

absl::Status RunScaleBench(const ScaleBenchOptions& o, std::ostream& out) {
  ZO_RETURN_IF_ERROR(ValidateScaleBenchOptions(o));
  // The worker is forked; gRPC must not have started here (it never does:
  // this process only runs `ip`, `tc` and zo-server).
  if (bench_internal::ThreadsBesidesBlasPool() > 1) {
    return absl::FailedPreconditionError(
        "zo-bench scale forks its worker and needs to run on its own (more threads run here)");
  }
  const std::string binary = ServerBinary(o);
  if (access(binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError("no zo-server at " + binary);
  }
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<cluster::NetnsHosts> hosts,
                      cluster::NetnsHosts::Create("zob"));
  char dir_template[] = "/tmp/zo-bench-scale-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
  const std::string dir = dir_template;
  struct RemoveDir {
    std::string dir;
    ~RemoveDir() { std::filesystem::remove_all(dir); }
  } remove_dir{dir};

  ZO_ASSIGN_OR_RETURN(const int worker, hosts->AddHost("wrk"));
  std::vector<int> server_hosts;
  const int most = *std::max_element(o.servers.begin(), o.servers.end());
  for (int s = 0; s < most; ++s) {
    ZO_ASSIGN_OR_RETURN(const int host, hosts->AddHost(absl::StrCat("srv", s)));
    if (o.link_mbit > 0) ZO_RETURN_IF_ERROR(hosts->LimitLink(host, o.link_mbit));
    server_hosts.push_back(host);
  }

  const int64_t bytes_per_step = 2 * o.params * 2;  // fp16 gradients out, fp16 weights back
  const std::string link =
      o.link_mbit > 0 ? absl::StrFormat("%d Mbit/s", o.link_mbit) : std::string("uncapped links");
  for (int connections : o.connections) {
    double baseline = 0;
    for (int k : o.servers) {
      std::vector<std::string> addresses;
      std::vector<testing::ChildProcess*> servers;
      for (int s = 0; s < k; ++s) {
        ZO_ASSIGN_OR_RETURN(cluster::HostServer server,
                            cluster::StartServerOnHost(*hosts, server_hosts[s], binary, dir));
        addresses.push_back(server.address);
        servers.push_back(server.process);
      }
      absl::StatusOr<std::vector<double>> steps =
          RunWorker(o, hosts->netns(worker), addresses, absl::StrCat("scale", k, "x", connections),
                    connections);
      for (testing::ChildProcess* s : servers) s->Kill();  // a fresh tier for the next count
      if (!steps.ok()) return steps.status();
      const double step_s = Median(*steps);
      if (baseline == 0) baseline = step_s * o.servers.front();
      const double efficiency = baseline / (k * step_s);
      const double bytes_per_s = bytes_per_step / step_s;
      if (o.json) {
        out << nlohmann::json{{"bench", "scale"},           {"servers", k},
                              {"connections", connections}, {"link_mbit", o.link_mbit},
                              {"step_s", step_s},           {"bytes_per_s", bytes_per_s},
                              {"efficiency", efficiency},   {"dpu", o.dpu}}
                   .dump()
            << std::endl;
      } else {
        const std::string share =
            o.link_mbit > 0
                ? absl::StrFormat(" (%.0f%% of the links one way)",
                                  100.0 * bytes_per_s * 8 / (1.0 * k * o.link_mbit * 1e6))
                : "";
        out << absl::StrFormat(
                   "scale: %d server host(s) at %s, %d connection(s) each: step %.3f s (median "
                   "of %d), %.1f MB/s pushed + pulled%s, efficiency %.2f%s\n",
                   k, link, connections, step_s, steps->size(), bytes_per_s / 1e6, share,
                   efficiency, o.dpu ? " (DPU)" : "")
            << std::flush;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace zo::bench
