#include "bench/wire_bench.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "bench/internal/bench_stats.h"
#include "bench/internal/fork_check.h"
#include "bench/internal/tcp_stream.h"
#include "common/dtype.h"
#include "common/fp16.h"
#include "common/logging.h"
#include "common/malloc_tuning.h"
#include "common/sharding.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "nlohmann/json.hpp"
#include "offload/io/io_error.h"
#include "server/offload_server.h"
#include "worker/client/offload_client.h"

namespace zo::bench {
namespace {

using bench_internal::SecondsSince;
using bench_internal::Summarize;
using bench_internal::Summary;
using bench_internal::TcpSender;
using bench_internal::TcpSink;

constexpr double kGB = 1e9;  // throughputs in decimal GB/s
// The client library's bound on a piece (worker/client/internal/setup.h: 64 MiB messages
// less room for the other fields).
constexpr int64_t kMaxPieceBytes = (int64_t{64} << 20) - 1024;
// How long the child may take to start its server and report its ports,
// and to exit once told to.
constexpr int kChildStartMs = 60'000;
constexpr auto kChildExitWait = std::chrono::seconds(10);
// How long a round waits for the server's optimizer step to finish.
constexpr absl::Duration kStepWait = absl::Minutes(10);

void WriteAll(int fd, const std::string& text) {
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// The child: an OffloadServer and a TCP sink on loopback; reports
// "ok <grpc port> <tcp port>\n" (or "error <message>\n") on `report_fd`, then
// serves until `control_fd` reaches end of file (the parent closed it or
// died). Never returns; _exit skips the destructors of the parent's copy.
[[noreturn]] void ChildMain(pid_t parent, int report_fd, int control_fd, size_t sink_read_bytes) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);  // the parent died before prctl
  // The server logs a line per job and per few steps at INFO; this process
  // shares the bench's stderr.
  SetMinLogLevel(LogLevel::kWarning);
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.log_every = 1 << 30;
  absl::StatusOr<std::unique_ptr<OffloadServer>> server = OffloadServer::Start(options);
  if (!server.ok()) {
    WriteAll(report_fd,
             absl::StrCat("error starting the OffloadServer: ", server.status().ToString(), "\n"));
    _exit(1);
  }
  absl::StatusOr<std::unique_ptr<TcpSink>> sink = TcpSink::Start(sink_read_bytes);
  if (!sink.ok()) {
    WriteAll(report_fd,
             absl::StrCat("error starting the TCP sink: ", sink.status().ToString(), "\n"));
    _exit(1);
  }
  WriteAll(report_fd, absl::StrCat("ok ", (*server)->port(), " ", (*sink)->port(), "\n"));
  close(report_fd);
  for (;;) {
    char c;
    const ssize_t n = read(control_fd, &c, 1);
    if (n == 0 || (n < 0 && errno != EINTR)) break;
  }
  (*sink)->Stop();
  (*server)->Shutdown(absl::Seconds(1));
  _exit(0);
}

// The forked server process, owned by the bench: the destructor tells it to
// exit, waits a while, then kills it, and always reaps it.
class ServerChild {
 public:
  static absl::StatusOr<std::unique_ptr<ServerChild>> Start(size_t sink_read_bytes) {
    if (const int threads = bench_internal::ThreadsBesidesBlasPool(); threads > 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "zo-bench wire forks its server process, which needs a single-threaded caller; this "
          "process runs ",
          threads, " threads (run `zo-bench wire` on its own)"));
    }
    int report[2], control[2];
    if (pipe2(report, O_CLOEXEC) != 0) return ZO_ERRNO_STATUS(errno, "pipe");
    if (pipe2(control, O_CLOEXEC) != 0) {
      const int err = errno;
      close(report[0]);
      close(report[1]);
      return ZO_ERRNO_STATUS(err, "pipe");
    }
    std::cout.flush();
    std::cerr.flush();
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid == 0) {
      close(report[0]);
      close(control[1]);
      ChildMain(parent, report[1], control[0], sink_read_bytes);
    }
    const int err = errno;
    close(report[1]);
    close(control[0]);
    if (pid < 0) {
      close(report[0]);
      close(control[1]);
      return ZO_ERRNO_STATUS(err, "fork of the server process");
    }
    std::unique_ptr<ServerChild> child(new ServerChild(pid, control[1]));
    absl::Status status = child->ReadPorts(report[0]);
    close(report[0]);
    if (!status.ok()) return status;  // the destructor stops the child
    return child;
  }

  ~ServerChild() {
    close(control_fd_);  // the child's cue to exit
    const auto give_up = std::chrono::steady_clock::now() + kChildExitWait;
    int wstatus = 0;
    for (;;) {
      const pid_t r = waitpid(pid_, &wstatus, WNOHANG);
      if (r == pid_ || (r < 0 && errno != EINTR)) break;
      if (std::chrono::steady_clock::now() > give_up) {
        std::cerr << "wire: the server process did not exit; killing it\n";
        kill(pid_, SIGKILL);
        while (waitpid(pid_, &wstatus, 0) < 0 && errno == EINTR) {
        }
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  pid_t pid() const { return pid_; }
  int grpc_port() const { return grpc_port_; }
  int tcp_port() const { return tcp_port_; }

  ServerChild(const ServerChild&) = delete;
  ServerChild& operator=(const ServerChild&) = delete;

 private:
  ServerChild(pid_t pid, int control_fd) : pid_(pid), control_fd_(control_fd) {}

  // Reads the child's one report line.
  absl::Status ReadPorts(int fd) {
    std::string line;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(kChildStartMs);
    while (line.find('\n') == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        return absl::DeadlineExceededError("the server process did not report its ports in 60 s");
      }
      pollfd p{fd, POLLIN, 0};
      const int ready = poll(&p, 1, static_cast<int>(left.count()));
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) return ZO_ERRNO_STATUS(errno, "poll on the server process's pipe");
      if (ready == 0) continue;
      char buf[512];
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ZO_ERRNO_STATUS(errno, "read from the server process's pipe");
      if (n == 0) {
        return absl::InternalError(absl::StrCat("the server process (pid ", pid_,
                                                ") exited before reporting its ports",
                                                line.empty() ? "" : ": " + line));
      }
      line.append(buf, static_cast<size_t>(n));
    }
    line.resize(line.find('\n'));
    std::vector<std::string> words = absl::StrSplit(line, ' ');
    if (words.size() == 3 && words[0] == "ok" && absl::SimpleAtoi(words[1], &grpc_port_) &&
        absl::SimpleAtoi(words[2], &tcp_port_) && grpc_port_ > 0 && tcp_port_ > 0) {
      return absl::OkStatus();
    }
    return absl::UnavailableError(absl::StrCat("server process: ", line));
  }

  const pid_t pid_;
  const int control_fd_;
  int grpc_port_ = 0;
  int tcp_port_ = 0;
};

// Minor page faults of process `pid` so far (all its threads), from
// /proc/<pid>/stat; -1 when unreadable. Large buffers that the allocator
// returns to the kernel and takes back show up here.
int64_t MinorFaults(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');  // the command name may hold spaces
  if (paren == std::string::npos) return -1;
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(text).substr(paren + 1), ' ', absl::SkipEmpty());
  int64_t n = -1;
  // After the name: state ppid pgrp session tty_nr tpgid flags minflt (proc(5)).
  if (fields.size() > 7 && absl::SimpleAtoi(fields[7], &n)) return n;
  return -1;
}

// One timed transfer: its time and the page faults of both ends meanwhile.
struct Transfer {
  double seconds = 0;
  int64_t client_faults = 0;
  int64_t server_faults = 0;
};

// Times `body` and counts the faults of this process and `server` around it.
template <typename Body>
absl::StatusOr<Transfer> TimeTransfer(pid_t server, Body body) {
  const int64_t client0 = MinorFaults(getpid()), server0 = MinorFaults(server);
  const auto start = std::chrono::steady_clock::now();
  ZO_RETURN_IF_ERROR(body());
  Transfer t;
  t.seconds = SecondsSince(start);
  t.client_faults = MinorFaults(getpid()) - client0;
  t.server_faults = MinorFaults(server) - server0;
  return t;
}

struct WireResult {
  std::vector<double> grpc_gbps, tcp_gbps, step_s;
  // Per MiB moved, per round.
  std::vector<double> grpc_client_faults, grpc_server_faults, tcp_client_faults, tcp_server_faults;
};

// Finite, varied fp16 values, as a backward pass gives (no NaN or Inf: the
// server would skip the step, which is not what is measured).
std::vector<uint16_t> MakeGradient(int64_t elems) {
  std::vector<uint16_t> g(static_cast<size_t>(elems));
  uint32_t x = 12345;
  for (uint16_t& h : g) {
    x = x * 1664525u + 1013904223u;
    h = FloatToHalfBits(static_cast<float>(static_cast<int>(x >> 22) - 512) * 1e-5f);
  }
  return g;
}

// Every setting the config parser would otherwise note on stderr is given.
std::string JobConfig(const WireBenchOptions& o) {
  const nlohmann::json config = {
      {"train_batch_size", 1},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
      {"gradient_clipping", 1.0},
      {"fp16", {{"enabled", true}}},
      {"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}}},
      {"zo", {{"chunk_elems", o.chunk_elems}}},
  };
  return config.dump();
}

// Polls the lead until `step` is applied; returns how long that took.
absl::StatusOr<double> WaitForVersion(OffloadClient& client, int64_t step) {
  const auto start = std::chrono::steady_clock::now();
  const absl::Time give_up = absl::Now() + kStepWait;
  for (;;) {
    ZO_ASSIGN_OR_RETURN(v1::JobStatus status, client.JobStatus());
    if (!status.needs_restore().empty()) {
      return absl::InternalError(
          absl::StrCat("the server's job needs a restore: ", status.needs_restore()));
    }
    if (status.version() >= step) return SecondsSince(start);
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat("step ", step, " was not applied within ", absl::FormatDuration(kStepWait)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

absl::StatusOr<WireResult> Measure(const WireBenchOptions& o, const ServerChild& child) {
  const int64_t elems = o.bytes / 2;
  // Shared, so PushShared sends it in place, as a worker hands over its
  // staging buffer.
  const auto grad = std::make_shared<const std::vector<uint16_t>>(MakeGradient(elems));
  const auto data = absl::MakeConstSpan(reinterpret_cast<const std::byte*>(grad->data()),
                                        static_cast<size_t>(o.bytes));
  ClientOptions options;
  options.job = "wire";
  options.servers = {absl::StrCat("127.0.0.1:", child.grpc_port())};
  options.max_piece_bytes = o.piece_bytes;
  options.max_bytes_in_flight = o.in_flight_bytes;
  std::vector<TensorSpec> manifest = {{.name = "grad", .shape = {elems}, .dtype = DType::kFloat16}};
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<OffloadClient> client,
                      OffloadClient::Open(options, JobConfig(o), std::move(manifest)));
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<TcpSender> tcp, TcpSender::Connect(child.tcp_port()));

  WireResult result;
  int64_t step = client->version();
  // From the first Push until FinishStep has every piece acknowledged; then,
  // untimed, until the server has applied the step.
  auto grpc_round = [&]() -> absl::StatusOr<Transfer> {
    ++step;
    ZO_ASSIGN_OR_RETURN(Transfer t, TimeTransfer(child.pid(), [&]() -> absl::Status {
                          ZO_RETURN_IF_ERROR(client->PushShared(step, 0, grad, data));
                          return client->FinishStep(step);
                        }));
    ZO_ASSIGN_OR_RETURN(double step_s, WaitForVersion(*client, step));
    result.step_s.push_back(step_s);
    return t;
  };
  auto tcp_round = [&]() -> absl::StatusOr<Transfer> {
    return TimeTransfer(child.pid(),
                        [&] { return tcp->SendRound(data, static_cast<size_t>(o.piece_bytes)); });
  };

  // Warm-up: connections, HTTP/2 windows, first touch of both sides' buffers.
  for (int r = 0; r < o.warmup_rounds; ++r) {
    ZO_ASSIGN_OR_RETURN(Transfer warm_grpc, grpc_round());
    ZO_ASSIGN_OR_RETURN(Transfer warm_tcp, tcp_round());
    std::cerr << absl::StrFormat("wire: warm-up %d/%d: grpc %.3f GB/s, tcp %.3f GB/s\n", r + 1,
                                 o.warmup_rounds, o.bytes / warm_grpc.seconds / kGB,
                                 o.bytes / warm_tcp.seconds / kGB);
  }
  result.step_s.clear();
  const double mib = static_cast<double>(o.bytes) / (1 << 20);
  for (int r = 0; r < o.rounds; ++r) {
    Transfer grpc, tcp_t;
    // Alternate which goes first, so neither always follows the other's
    // traffic (or the server's optimizer step) straight away.
    for (int turn = 0; turn < 2; ++turn) {
      if ((turn == 0) == (r % 2 == 0)) {
        ZO_ASSIGN_OR_RETURN(grpc, grpc_round());
      } else {
        ZO_ASSIGN_OR_RETURN(tcp_t, tcp_round());
      }
    }
    const double g = o.bytes / grpc.seconds / kGB, t = o.bytes / tcp_t.seconds / kGB;
    result.grpc_gbps.push_back(g);
    result.tcp_gbps.push_back(t);
    result.grpc_client_faults.push_back(grpc.client_faults / mib);
    result.grpc_server_faults.push_back(grpc.server_faults / mib);
    result.tcp_client_faults.push_back(tcp_t.client_faults / mib);
    result.tcp_server_faults.push_back(tcp_t.server_faults / mib);
    std::cerr << absl::StrFormat(
        "wire: round %d/%d %s first: grpc %.3f GB/s, tcp %.3f GB/s, ratio %.3f; page faults "
        "per MiB grpc %.1f + %.1f, tcp %.1f + %.1f (client + server); server step %.3f s, "
        "untimed\n",
        r + 1, o.rounds, r % 2 == 0 ? "grpc" : "tcp", g, t, g / t, grpc.client_faults / mib,
        grpc.server_faults / mib, tcp_t.client_faults / mib, tcp_t.server_faults / mib,
        result.step_s.back());
  }
  return result;
}

void Print(const WireBenchOptions& o, const WireResult& r, std::ostream& out) {
  using bench_internal::Median;
  const Summary grpc = Summarize(r.grpc_gbps), tcp = Summarize(r.tcp_gbps);
  const double ratio = grpc.median / tcp.median;
  if (o.json) {
    const nlohmann::json j = {{"bench", "wire"},
                              {"bytes", o.bytes},
                              {"grpc_gb_per_s", grpc.median},
                              {"tcp_gb_per_s", tcp.median},
                              {"ratio", ratio},
                              {"grpc_gb_per_s_min", grpc.min},
                              {"grpc_gb_per_s_max", grpc.max},
                              {"tcp_gb_per_s_min", tcp.min},
                              {"tcp_gb_per_s_max", tcp.max},
                              {"rounds", o.rounds},
                              {"warmup_rounds", o.warmup_rounds},
                              {"piece_bytes", o.piece_bytes},
                              {"in_flight_bytes", o.in_flight_bytes},
                              {"chunk_elems", o.chunk_elems},
                              {"grpc_client_faults_per_mib", Median(r.grpc_client_faults)},
                              {"grpc_server_faults_per_mib", Median(r.grpc_server_faults)},
                              {"tcp_client_faults_per_mib", Median(r.tcp_client_faults)},
                              {"tcp_server_faults_per_mib", Median(r.tcp_server_faults)},
                              {"server_step_s", Median(r.step_s)}};
    out << j.dump() << std::endl;
    return;
  }
  out << absl::StrFormat(
      "\nwire: %s of fp16 gradients per round from this process to a child process over "
      "127.0.0.1\n"
      "  grpc = OffloadClient PushShared (no client copy) of one tensor (%d elements, chunks of "
      "%d) in pieces of %d "
      "bytes,\n         %d bytes in flight, until FinishStep has every piece acknowledged by "
      "the OffloadServer\n"
      "  tcp  = the same bytes in send() calls of %d bytes on one connection, until the sink "
      "acknowledges\n"
      "  %d rounds after %d of warm-up, alternating which goes first; the server's optimizer "
      "step (median %.3f s)\n  runs between rounds, untimed; GB = 1e9 bytes\n"
      "  ratio = median grpc GB/s / median tcp GB/s (target >= 0.8)\n\n"
      "%-11s %-9s %10s %9s %7s   %-14s %s\n",
      FormatBytes(static_cast<double>(o.bytes)), o.bytes / 2, o.chunk_elems, o.piece_bytes,
      o.in_flight_bytes, o.piece_bytes, o.rounds, o.warmup_rounds, Median(r.step_s), "bytes",
      "piece", "grpc GB/s", "tcp GB/s", "ratio", "grpc min..max", "tcp min..max");
  out << absl::StrFormat("%-11d %-9d %10.3f %9.3f %7.3f   %-14s %.3f..%.3f\n", o.bytes,
                         o.piece_bytes, grpc.median, tcp.median, ratio,
                         absl::StrFormat("%.3f..%.3f", grpc.min, grpc.max), tcp.min, tcp.max);
  out << absl::StrFormat(
             "\npage faults per MiB moved (medians; client + server): grpc %.1f + %.1f, "
             "tcp %.1f + %.1f\n",
             Median(r.grpc_client_faults), Median(r.grpc_server_faults),
             Median(r.tcp_client_faults), Median(r.tcp_server_faults))
      << std::flush;
}

}  // namespace

absl::Status ValidateWireBenchOptions(const WireBenchOptions& o) {
  if (o.bytes < 2 || o.bytes % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--bytes must be a positive even count (fp16 elements), got ", o.bytes));
  }
  if (o.rounds < 1) return absl::InvalidArgumentError("--rounds must be at least 1");
  if (o.warmup_rounds < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--warmup-rounds must not be negative, got ", o.warmup_rounds));
  }
  if (o.piece_bytes < 2 || o.piece_bytes > kMaxPieceBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--piece-bytes must be in [2, ", kMaxPieceBytes, "], got ", o.piece_bytes));
  }
  if (o.in_flight_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--in-flight-bytes must be positive, got ", o.in_flight_bytes));
  }
  if (o.chunk_elems < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chunk-elems must be positive, got ", o.chunk_elems));
  }
  return absl::OkStatus();
}

absl::Status RunWireBench(const WireBenchOptions& o, std::ostream& out) {
  ZO_RETURN_IF_ERROR(ValidateWireBenchOptions(o));
  // As zo-server and zo-train run: both ends (the fork inherits it).
  TuneMallocForBulkMessages();
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<ServerChild> child,
                      ServerChild::Start(static_cast<size_t>(o.piece_bytes)));
  std::cerr << "wire: server process on 127.0.0.1:" << child->grpc_port()
            << ", TCP sink on 127.0.0.1:" << child->tcp_port() << "\n";
  // The client is gone (its calls finished) before `child` is stopped.
  ZO_ASSIGN_OR_RETURN(WireResult result, Measure(o, *child));
  Print(o, result, out);
  return absl::OkStatus();
}

}  // namespace zo::bench
