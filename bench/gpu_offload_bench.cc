#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/internal/bench_gpt.h"
#include "bench/internal/bench_stats.h"
#include "bench/internal/gpu_offload_rows.h"
#include "common/memory_estimate.h"
#include "common/sharding.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "server/offload_server.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/client/offload_client.h"
#include "worker/data/char_dataset.h"
#include "worker/data/synthetic_source.h"
#include "worker/model/model.h"
#include "worker/train/offload_link.h"
#include "worker/train/trainer.h"

namespace zo::bench_internal {
namespace {

// A DeepSpeed-style config for the benchmark jobs: AdamW, the step's dtype,
// DPU after one step when `dpu`, the lr warmed up linearly over
// `warmup_steps` when > 0.
// `nvme_dir` non-empty: the optimizer state on NVMe there, and with
// `params_on_nvme` the streamed weights too (offload_param "nvme").
std::string JobConfig(DType dtype, int micro_batch, int micro_batches, bool dpu, double lr,
                      int warmup_steps = 0, const std::string& gradient_accumulation = "auto",
                      const std::string& nvme_dir = "", bool params_on_nvme = false) {
  const std::string scheduler =
      warmup_steps == 0 ? ""
                        : absl::StrFormat(R"("scheduler": {"type": "WarmupLR", "params": {
                "warmup_min_lr": 0, "warmup_max_lr": %g, "warmup_num_steps": %d,
                "warmup_type": "linear"}},)",
                                          lr, warmup_steps);
  const std::string zero =
      nvme_dir.empty()
          ? ""
          : absl::StrFormat(R"("zero_optimization": {"offload_optimizer": {"device": "nvme",
                "nvme_path": "%s"}%s},)",
                            nvme_dir,
                            params_on_nvme
                                ? absl::StrFormat(R"(, "offload_param": {"device": "nvme",
                                                     "nvme_path": "%s"})",
                                                  nvme_dir)
                                : "");
  return absl::StrFormat(
      R"({"train_batch_size": %d, "train_micro_batch_size_per_gpu": %d,
          "optimizer": {"type": "AdamW", "params": {"lr": %g, "betas": [0.9, 0.95],
                                                    "weight_decay": 0.1}}, %s %s
          "%s": {"enabled": true}, "gradient_clipping": 1.0, "steps_per_print": 1000000,
          "zo": {"dpu": {"enabled": %s, "warmup_steps": 1}, "gradient_accumulation": "%s"}})",
      micro_batch * micro_batches, micro_batch, lr, scheduler, zero,
      dtype == DType::kFloat16 ? "fp16" : "bf16", dpu ? "true" : "false", gradient_accumulation);
}

// The server tier's step with no GPU in it: every gradient pushed from
// page-locked memory, the update, every weight pulled back. Seconds per
// step, median over `steps` after one untimed step.
absl::StatusOr<double> ServerStepAlone(const bench::GpuBenchOptions& o, backend::Backend& b,
                                       OffloadServer& server,
                                       const std::vector<TensorSpec>& manifest) {
  ClientOptions options;
  options.job = "gpu-server-alone";
  options.channels = {server.InProcessChannel()};
  options.routes = {server.DataRoute()};
  ZO_ASSIGN_OR_RETURN(
      std::unique_ptr<OffloadClient> client,
      OffloadClient::Open(options, JobConfig(o.dtype, o.batch, o.micro_batches, false, 1e-4),
                          manifest));
  std::vector<int64_t> bytes;
  int64_t total = 0;
  for (const TensorSpec& t : manifest) {
    bytes.push_back(NumElements(t.shape) * 2);  // fp16 or bf16
    total += bytes.back();
  }
  std::shared_ptr<std::byte> grads = b.AllocateHost(static_cast<size_t>(total));
  std::vector<std::byte> weights(static_cast<size_t>(total));
  // 1e-3 in the job's dtype.
  const uint16_t small = o.dtype == DType::kFloat16 ? 0x1419 : 0x3A83;
  for (int64_t i = 0; i < total / 2; ++i) {
    std::memcpy(grads.get() + 2 * i, &small, 2);
  }
  std::vector<int> tensors;
  std::vector<absl::Span<std::byte>> dst;
  int64_t offset = 0;
  for (size_t i = 0; i < manifest.size(); ++i) {
    tensors.push_back(static_cast<int>(i));
    dst.emplace_back(weights.data() + offset, bytes[i]);
    offset += bytes[i];
  }
  std::vector<double> secs;
  for (int64_t step = 1; step <= 1 + o.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    offset = 0;
    for (size_t i = 0; i < manifest.size(); ++i) {
      ZO_RETURN_IF_ERROR(client->PushShared(
          step, static_cast<int>(i), grads,
          absl::Span<const std::byte>(grads.get() + offset, static_cast<size_t>(bytes[i]))));
      offset += bytes[i];
    }
    ZO_RETURN_IF_ERROR(client->FinishStep(step));
    ZO_RETURN_IF_ERROR(client->Pull(step, step - 1, tensors, dst).status());
    if (step > 1) secs.push_back(SecondsSince(start));
    std::fprintf(stderr, "zo-bench gpu: server alone, step %lld: %.1f ms\n",
                 static_cast<long long>(step), SecondsSince(start) * 1e3);
  }
  return Median(secs);
}

}  // namespace

absl::StatusOr<nlohmann::json> MeasureGpuOffloaded(const bench::GpuBenchOptions& o,
                                                   backend::Backend& b, double compute_alone_s,
                                                   bool dpu) {
  ServerOptions server_options;
  server_options.listen = "";  // in-process only
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<OffloadServer> server, OffloadServer::Start(server_options));
  ZO_ASSIGN_OR_RETURN(model::Model m, MakeBenchModel(o));
  const int64_t params = m.param_count();
  const std::vector<TensorSpec> manifest = m.Manifest(o.dtype);

  ZO_ASSIGN_OR_RETURN(const double server_alone_s, ServerStepAlone(o, b, *server, manifest));

  // The embedded server's data takes the in-process route, as zo-train's does.
  ClientOptions options;
  options.job = dpu ? "gpu-dpu" : "gpu-sync";
  options.channels = {server->InProcessChannel()};
  options.routes = {server->DataRoute()};
  ZO_ASSIGN_OR_RETURN(
      std::unique_ptr<OffloadClient> client,
      OffloadClient::Open(options, JobConfig(o.dtype, o.batch, o.micro_batches, dpu, 1e-4),
                          manifest));
  train::OffloadLink link(client.get(), b, manifest, o.dtype);
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<BenchGpt> gpt, BenchGpt::Create(o, b, std::move(m), link));
  ZO_RETURN_IF_ERROR(link.InitializeIfFresh(gpt->stage().params(), o.seed));
  // DPU starts at step 3 (one warm-up step, then one more on v1); steady
  // from the step after.
  const int first_timed = 4 + o.warmup_steps;
  std::vector<double> step_s, compute_s, push_s, pull_s;
  for (int s = 1; s < first_timed + o.steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    ZO_ASSIGN_OR_RETURN(pipeline::StepTimes t, gpt->RunStep(s));
    const double secs = SecondsSince(start);
    std::fprintf(stderr,
                 "zo-bench gpu: %s step %d: %.1f ms (compute %.1f, wait for weights %.1f, "
                 "for the push %.1f), loss %.4f\n",
                 dpu ? "DPU" : "sync", s, secs * 1e3, t.compute_s * 1e3, t.pull_s * 1e3,
                 t.push_s * 1e3, gpt->stage().step_loss());
    if (s < first_timed) continue;
    step_s.push_back(secs);
    compute_s.push_back(t.compute_s);
    push_s.push_back(t.push_s);
    pull_s.push_back(t.pull_s);
  }
  const Summary step = Summarize(step_s);
  const double bound = std::max(compute_alone_s, server_alone_s);
  return nlohmann::json{{"workload", dpu ? "gpu_dpu" : "gpu_sync"},
                        {"device", b.name()},
                        {"dtype", std::string(DTypeName(o.dtype))},
                        {"params", params},
                        {"step_s", step.median},
                        {"step_s_min", step.min},
                        {"step_s_max", step.max},
                        {"compute_alone_s", compute_alone_s},
                        {"server_alone_s", server_alone_s},
                        {"step_compute_s", Median(compute_s)},
                        {"step_wait_weights_s", Median(pull_s)},
                        {"step_wait_push_s", Median(push_s)},
                        {"ratio", step.median / compute_alone_s},  // target <= 1.3
                        {"ratio_to_slower", step.median / bound}};
}

namespace {

// The most GPU memory in use while `run` runs, sampled every 50 ms (-1
// without a CUDA device).
template <typename Run>
int64_t PeakDeviceMemory(int device, Run&& run) {
  std::atomic<bool> done = false;
  std::atomic<int64_t> peak = -1;
  std::thread sampler([&] {
    while (!done.load()) {
      peak = std::max(peak.load(), backend::CudaMemoryInUse(device));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  run();
  done = true;
  sampler.join();
  return peak.load();
}

// This process's peak resident bytes since the last ResetPeakRss (VmHWM).
int64_t PeakRss() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}
void ResetPeakRss() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace

absl::StatusOr<nlohmann::json> MeasureGpuLargest(const bench::GpuBenchOptions& o) {
  // The model zo-train builds on its synthetic text.
  ZO_ASSIGN_OR_RETURN(CharDataset text,
                      CharDataset::FromText(SyntheticText(size_t{1} << 20, o.seed), o.seed));
  const model::GptConfig gpt{.n_layer = o.largest_layers,
                             .n_embd = o.largest_width,
                             .n_head = o.largest_heads,
                             .block_size = o.largest_block,
                             .vocab = text.vocab().size()};
  ZO_ASSIGN_OR_RETURN(model::Model m, model::MakeGpt(gpt));
  const int64_t params = m.param_count();
  const bool nvme = !o.largest_nvme_dir.empty();
  ZO_ASSIGN_OR_RETURN(
      MemoryEstimate estimate,
      EstimateMemory({.tensor_elems = {params}, .precision = o.dtype, .nvme = nvme}));
  // Streaming sums the gradients on the servers ("auto" picks it).
  const bool sums_on_servers =
      o.largest_gradient_accumulation == "servers" || o.largest_device_memory_budget > 0;
  std::fprintf(
      stderr,
      "zo-bench gpu: largest: GPT %d layers x %d wide, %d heads, block %d (%.2fB parameters); the "
      "server's state needs %.1f GiB of RAM and %.1f GiB of NVMe%s\n",
      o.largest_layers, o.largest_width, o.largest_heads, o.largest_block, params / 1e9,
      (sums_on_servers ? estimate.server_ram_bytes_servers : estimate.server.ram_bytes) /
          double(1 << 30),
      estimate.server.nvme_bytes / double(1 << 30),
      o.largest_device_memory_budget > 0
          ? absl::StrFormat("; weights streamed within %s of device memory%s",
                            FormatBytes(static_cast<double>(o.largest_device_memory_budget)),
                            nvme ? ", from a file on NVMe" : "")
                .c_str()
          : "");

  ServerOptions server_options;
  server_options.listen = "";  // in-process only
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<OffloadServer> server, OffloadServer::Start(server_options));
  const std::string metrics = absl::StrCat("/tmp/zo-bench-largest-", getpid(), ".jsonl");
  std::remove(metrics.c_str());
  train::TrainOptions t;
  t.config_json = JobConfig(o.dtype, o.largest_batch, 1, true, o.largest_lr, o.largest_warmup_steps,
                            o.largest_gradient_accumulation, o.largest_nvme_dir,
                            /*params_on_nvme=*/o.largest_device_memory_budget > 0);
  t.device_memory_budget = o.largest_device_memory_budget;
  t.model = "gpt";
  t.gpt = gpt;
  t.seed = o.seed;
  t.channels = {server->InProcessChannel()};
  t.routes = {server->DataRoute()};
  t.job = "gpu-largest";
  t.steps = o.largest_steps;
  t.metrics_out = metrics;
  t.device = o.largest_device;
  t.gpu = o.device;
  t.out = stderr;
  ResetPeakRss();
  absl::Status trained;
  const auto start = std::chrono::steady_clock::now();
  const int64_t peak_gpu = PeakDeviceMemory(o.device, [&] { trained = train::Train(t); });
  const double wall_s = SecondsSince(start);
  const int64_t peak_rss = PeakRss();
  server->Shutdown(absl::Seconds(1));
  ZO_RETURN_IF_ERROR(trained);

  std::vector<double> losses, step_s;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    if (j["loss"].is_number()) losses.push_back(j["loss"].get<double>());
    step_s.push_back(j["step_s"].get<double>());
  }
  std::remove(metrics.c_str());
  if (losses.size() < 2) return absl::InternalError("the largest run left no losses to compare");
  // The steady state: the second half of the run.
  const std::vector<double> steady(step_s.begin() + static_cast<long>(step_s.size() / 2),
                                   step_s.end());
  return nlohmann::json{
      {"workload", "gpu_largest"},
      {"dtype", std::string(DTypeName(o.dtype))},
      {"params", params},
      {"layers", o.largest_layers},
      {"width", o.largest_width},
      {"block", o.largest_block},
      {"batch", o.largest_batch},
      {"lr", o.largest_lr},
      {"lr_warmup_steps", o.largest_warmup_steps},
      {"gradient_accumulation", o.largest_gradient_accumulation},
      {"device_memory_budget", o.largest_device_memory_budget},
      {"streamed", o.largest_device_memory_budget > 0},
      {"optimizer_device", nvme ? "nvme" : "cpu"},
      {"param_device", o.largest_device_memory_budget == 0 ? "none"
                       : nvme                              ? "nvme"
                                                           : "cpu"},
      {"steps", losses.size()},
      {"first_loss", losses.front()},
      {"last_loss", losses.back()},
      {"loss_fell", losses.back() < losses.front()},
      {"step_s", Median(steady)},
      {"wall_s", wall_s},
      {"peak_gpu_bytes", peak_gpu},
      {"peak_host_rss_bytes", peak_rss},
      {"server_ram_bytes_estimate",
       sums_on_servers ? estimate.server_ram_bytes_servers : estimate.server.ram_bytes},
      {"server_nvme_bytes_estimate", estimate.server.nvme_bytes},
      {"losses", losses}};
}

}  // namespace zo::bench_internal
