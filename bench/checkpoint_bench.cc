#include "bench/checkpoint_bench.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "bench/internal/bench_stats.h"
#include "common/fp16.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "server/offload_server.h"
#include "worker/client/offload_client.h"

namespace zo::bench {
namespace {

using bench_internal::Median;
using bench_internal::SecondsSince;

enum class Mode { kNone, kBackground, kBlocking };
constexpr Mode kModes[] = {Mode::kNone, Mode::kBackground, Mode::kBlocking};
const char* Name(Mode m) {
  switch (m) {
    case Mode::kNone:
      return "none";
    case Mode::kBackground:
      return "background";
    case Mode::kBlocking:
      return "blocking";
  }
  return "?";
}

std::string JobConfig(const CheckpointBenchOptions& o) {
  const nlohmann::json config = {
      {"train_batch_size", 1},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}},
      {"fp16", {{"enabled", true}}},
      {"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}}},
      {"zo", {{"chunk_elems", o.chunk_elems}, {"dpu", {{"enabled", o.dpu}, {"warmup_steps", 0}}}}},
  };
  return config.dump();
}

// Removes the scratch folder however the bench ends.
struct ScratchDir {
  std::string path;
  ~ScratchDir() {
    std::error_code ignored;
    if (!path.empty()) std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace

absl::Status ValidateCheckpointBenchOptions(const CheckpointBenchOptions& o) {
  if (o.params < 1) return absl::InvalidArgumentError("--params must be at least 1");
  if (o.every < 1) return absl::InvalidArgumentError("--checkpoint-every must be at least 1");
  if (o.steps < o.every) {
    return absl::InvalidArgumentError(absl::StrCat("--checkpoint-steps (", o.steps,
                                                   ") must be at least --checkpoint-every (",
                                                   o.every, ") so a segment has a checkpoint"));
  }
  if (o.rounds < 1) return absl::InvalidArgumentError("--rounds must be at least 1");
  if (o.compute_ms < 0) return absl::InvalidArgumentError("--compute-ms must be >= 0");
  if (!std::filesystem::is_directory(o.dir)) {
    return absl::InvalidArgumentError(absl::StrCat("--dir ", o.dir, " is not a directory"));
  }
  return absl::OkStatus();
}

absl::Status RunCheckpointBench(const CheckpointBenchOptions& o, std::ostream& out) {
  ZO_RETURN_IF_ERROR(ValidateCheckpointBenchOptions(o));
  ScratchDir scratch{absl::StrCat(o.dir, "/zo-bench-checkpoint-", getpid())};
  std::filesystem::create_directories(scratch.path);
  ServerOptions server_options;
  server_options.listen = "127.0.0.1:0";
  server_options.threads = o.threads;
  server_options.checkpoint_dir = scratch.path;
  server_options.keep_checkpoints = 2;
  server_options.log_every = 1 << 30;
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<OffloadServer> server, OffloadServer::Start(server_options));

  ClientOptions client_options;
  client_options.job = "checkpoint-bench";
  client_options.servers = {absl::StrCat("127.0.0.1:", server->port())};
  std::vector<TensorSpec> manifest = {{.name = "w", .shape = {o.params}, .dtype = DType::kFloat16}};
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<OffloadClient> client,
                      OffloadClient::Open(client_options, JobConfig(o), std::move(manifest)));
  // Small, finite gradients: every step is applied, none skipped.
  auto grad = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(o.params));
  uint32_t x = 7;
  for (uint16_t& h : *grad) {
    x = x * 1664525u + 1013904223u;
    h = FloatToHalfBits(static_cast<float>(static_cast<int>(x >> 22) - 512) * 1e-5f);
  }
  const std::shared_ptr<const std::vector<uint16_t>> shared = grad;
  const auto data = absl::MakeConstSpan(reinterpret_cast<const std::byte*>(grad->data()),
                                        static_cast<size_t>(o.params * 2));
  std::vector<std::byte> weights(static_cast<size_t>(o.params * 2));
  const std::vector<absl::Span<std::byte>> dst = {absl::MakeSpan(weights)};
  const int tensors[] = {0};

  int64_t step = 0;
  const auto one_step = [&]() -> absl::Status {
    ++step;
    // The forward and backward that make this step's gradients.
    if (o.compute_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.compute_ms));
    ZO_RETURN_IF_ERROR(client->PushShared(step, 0, shared, data));
    ZO_RETURN_IF_ERROR(client->FinishStep(step));
    // Without DPU step t + 1 computes on v(t); with it, on v(t - 1).
    const int64_t version = o.dpu ? step - 1 : step;
    return client->Pull(version, version - 1, tensors, dst).status();
  };
  // Warm-up: connections, first touch of the state and the page cache.
  for (int i = 0; i < 2; ++i) ZO_RETURN_IF_ERROR(one_step());
  ZO_RETURN_IF_ERROR(client->Checkpoint(step).status());

  std::map<Mode, std::vector<double>> steps_per_s;
  int checkpoints = 0;
  for (int round = 0; round < o.rounds; ++round) {
    for (int k = 0; k < 3; ++k) {
      const Mode mode = kModes[(round + k) % 3];
      std::future<absl::StatusOr<std::string>> pending;
      const auto start = std::chrono::steady_clock::now();
      for (int i = 1; i <= o.steps; ++i) {
        ZO_RETURN_IF_ERROR(one_step());
        if (mode == Mode::kNone || i % o.every != o.every / 2) continue;
        ++checkpoints;
        if (mode == Mode::kBlocking) {
          ZO_RETURN_IF_ERROR(client->Checkpoint(step).status());
          continue;
        }
        if (pending.valid()) ZO_RETURN_IF_ERROR(pending.get().status());
        pending =
            std::async(std::launch::async, [&client, at = step] { return client->Checkpoint(at); });
      }
      if (pending.valid()) ZO_RETURN_IF_ERROR(pending.get().status());
      const double seconds = SecondsSince(start);
      steps_per_s[mode].push_back(o.steps / seconds);
      std::cerr << absl::StrFormat(
          "checkpoint: round %d, %-10s %d steps in %.2f s (%.3f steps/s)\n", round + 1, Name(mode),
          o.steps, seconds, o.steps / seconds);
    }
  }
  client.reset();
  server->Shutdown(absl::Seconds(5));

  const double none = Median(steps_per_s[Mode::kNone]);
  const double background = Median(steps_per_s[Mode::kBackground]);
  const double blocking = Median(steps_per_s[Mode::kBlocking]);
  if (o.json) {
    out << nlohmann::json{{"bench", "checkpoint"},
                          {"params", o.params},
                          {"every", o.every},
                          {"steps", o.steps},
                          {"rounds", o.rounds},
                          {"compute_ms", o.compute_ms},
                          {"dpu", o.dpu},
                          {"state_bytes", o.params * 12},
                          {"steps_per_s_none", none},
                          {"steps_per_s_background", background},
                          {"steps_per_s_blocking", blocking},
                          {"ratio", background / none},
                          {"ratio_blocking", blocking / none}}
               .dump()
        << "\n";
  } else {
    out << absl::StrFormat(
        "checkpoint every %d steps, %d params (%.2f GiB of state), worker compute %d ms per "
        "step%s, %d checkpoints written\n"
        "  none        %.3f steps/s\n  background  %.3f steps/s  ratio %.3f (target >= 0.95)\n"
        "  blocking    %.3f steps/s  ratio %.3f\n",
        o.every, o.params, o.params * 12.0 / (1 << 30), o.compute_ms,
        o.dpu ? ", DPU (each checkpoint also holds the version before)" : "", checkpoints, none,
        background, background / none, blocking, blocking / none);
  }
  return absl::OkStatus();
}

}  // namespace zo::bench
