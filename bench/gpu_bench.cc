#include "bench/gpu_bench.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/internal/bench_gpt.h"
#include "bench/internal/bench_stats.h"
#include "bench/internal/gpu_offload_rows.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/model/model.h"
#include "worker/model/model_stage.h"

namespace zo::bench {
namespace {

using backend::Backend;
using backend::Tensor;
using bench_internal::SecondsSince;

// Seconds per call of `run`, after `warmup` calls, over `reps` calls, with
// the device drained before the clock starts and after it stops.
template <typename Run>
double TimeDevice(Backend& b, int warmup, int reps, Run&& run) {
  for (int i = 0; i < warmup; ++i) run();
  b.Synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) run();
  b.Synchronize();
  return SecondsSince(start) / reps;
}

Tensor Filled(Backend& b, DType dtype, backend::Shape shape, float scale) {
  Tensor t = b.Empty(dtype, shape);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  uint64_t x = 88172645463325252ull;  // xorshift: cheap, fixed values
  for (float& f : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    f = scale * (static_cast<float>(x >> 40) / static_cast<float>(1 << 24) - 0.5f);
  }
  (void)b.UploadFloat(v, t);
  return t;
}

// Seconds of y = x · w^T for x [rows, in], w [out, in] (+ bias), and of its
// backward (dw and dx), each alone.
struct LinearTimes {
  double forward_s = 0, backward_s = 0;
};
LinearTimes TimeLinear(Backend& b, DType dtype, int64_t rows, int64_t in, int64_t out) {
  const Tensor x = Filled(b, dtype, {rows, in}, 1.0f), w = Filled(b, dtype, {out, in}, 0.1f);
  const Tensor bias = Filled(b, dtype, {out}, 0.1f), dy = Filled(b, dtype, {rows, out}, 1.0f);
  Tensor dw = b.Zeros(DType::kFloat32, {out, in}), db = b.Zeros(DType::kFloat32, {out});
  LinearTimes t;
  t.forward_s = TimeDevice(b, 2, 5, [&] { (void)b.Linear(x, w, bias); });
  t.backward_s = TimeDevice(b, 2, 5, [&] { (void)b.LinearBackward(x, w, dy, true, dw, &db); });
  return t;
}

// The step's weights: InitialValues once; gradients stay on the device.
class DeviceOnlyLink final : public model::ParamLink {
 public:
  DeviceOnlyLink(Backend& b, uint64_t seed, double loss_scale)
      : b_(b), seed_(seed), loss_scale_(loss_scale) {}
  absl::Status LoadWeights(int64_t, absl::Span<model::Param* const> params) override {
    if (loaded_) return absl::OkStatus();
    for (model::Param* p : params) {
      ZO_RETURN_IF_ERROR(b_.UploadFloat(model::InitialValues(*p, seed_), p->value));
    }
    loaded_ = true;
    return absl::OkStatus();
  }
  double LossScale(int64_t) override { return loss_scale_; }
  absl::Status PushGradient(int64_t, const model::Param&, int) override { return absl::OkStatus(); }
  absl::Status FinishStep(int64_t) override { return absl::OkStatus(); }

 private:
  Backend& b_;
  const uint64_t seed_;
  const double loss_scale_;
  bool loaded_ = false;
};

}  // namespace

int32_t GpuBenchToken(int64_t step, int micro_batch, int64_t i, int vocab) {
  uint64_t x = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull +
               static_cast<uint64_t>(step) * 0xBF58476D1CE4E5B9ull +
               static_cast<uint64_t>(micro_batch) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return static_cast<int32_t>(x % static_cast<uint64_t>(vocab));
}

absl::Status ValidateGpuBenchOptions(const GpuBenchOptions& o) {
  if (o.gemm_size < 256) return absl::InvalidArgumentError("--gemm-size must be at least 256");
  if (o.n_layer < 1 || o.n_embd < 1 || o.n_head < 1 || o.n_embd % o.n_head != 0) {
    return absl::InvalidArgumentError("the model needs layers >= 1 and a width that heads divide");
  }
  if (o.batch < 1 || o.micro_batches < 1 || o.steps < 1 || o.warmup_steps < 0) {
    return absl::InvalidArgumentError("--batch, --micro-batches and --steps must be >= 1");
  }
  if (o.dtype == DType::kFloat32) {
    return absl::InvalidArgumentError("--dtype: the GPU step is fp16 or bf16");
  }
  if ((o.dpu || o.sync) && !o.step_rows) {
    return absl::InvalidArgumentError("rows gpu_dpu and gpu_sync need gpu_step (its compute time)");
  }
  if (!o.step_rows && !o.largest) return absl::InvalidArgumentError("no rows to run");
  if (o.largest &&
      (o.largest_layers < 1 || o.largest_width < 1 || o.largest_heads < 1 ||
       o.largest_width % o.largest_heads != 0 || o.largest_block < 1 || o.largest_batch < 1 ||
       o.largest_steps < 2 || !(o.largest_lr > 0) || o.largest_warmup_steps < 0)) {
    return absl::InvalidArgumentError(
        "gpu_largest needs layers, width, block and batch >= 1, heads that divide the width, "
        "at least 2 steps, an lr > 0 and warmup steps >= 0");
  }
  return absl::OkStatus();
}

namespace {

// Rows gpu_gemm, gpu_step and (with o.dpu) gpu_dpu, written to `out`.
absl::Status RunStepRows(const GpuBenchOptions& o, std::ostream& out) {
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<Backend> be, backend::MakeCudaBackend({.device = o.device}));
  const std::string dtype(DTypeName(o.dtype));

  // ---- the peak: one large GEMM.
  std::fprintf(stderr, "zo-bench gpu: %lld^3 %s GEMM on %s\n", static_cast<long long>(o.gemm_size),
               dtype.c_str(), be->name().c_str());
  double peak_flops = 0;
  {
    const int64_t n = o.gemm_size;
    const Tensor x = Filled(*be, o.dtype, {n, n}, 1.0f), w = Filled(*be, o.dtype, {n, n}, 0.1f);
    const double s = TimeDevice(*be, 3, 10, [&] { (void)be->Linear(x, w, Tensor()); });
    peak_flops = 2.0 * n * n * n / s;
  }

  // ---- the step.
  ZO_ASSIGN_OR_RETURN(model::Model m, bench_internal::MakeBenchModel(o));
  const int64_t params = m.param_count();
  DeviceOnlyLink link(*be, o.seed, o.dtype == DType::kFloat16 ? 1024.0 : 1.0);
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<bench_internal::BenchGpt> gpt,
                      bench_internal::BenchGpt::Create(o, *be, std::move(m), link));
  const int64_t tokens = int64_t{o.batch} * o.block_size * o.micro_batches;
  std::fprintf(stderr,
               "zo-bench gpu: GPT %d layers x %d wide, %d heads, block %d, vocab %d (%.1fM "
               "parameters), %lld tokens per step, %s\n",
               o.n_layer, o.n_embd, o.n_head, o.block_size, o.vocab, params / 1e6,
               static_cast<long long>(tokens), dtype.c_str());
  double first_loss = 0;
  std::vector<double> step_s;
  for (int s = 1; s <= o.warmup_steps + o.steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    ZO_RETURN_IF_ERROR(gpt->RunStep(s).status());
    be->Synchronize();
    const double secs = SecondsSince(start);
    if (s == 1) first_loss = gpt->stage().step_loss();
    if (s > o.warmup_steps) step_s.push_back(secs);
    std::fprintf(stderr, "zo-bench gpu: step %d: %.1f ms, loss %.4f\n", s, secs * 1e3,
                 gpt->stage().step_loss());
  }
  const bench_internal::Summary step = bench_internal::Summarize(step_s);
  // PaLM's count: 6 x the parameters a token's matmuls use (the untied
  // head's included; the embedding tables, wte and wpe, are lookups), plus
  // attention's 12 L C T.
  const double embedding_params = static_cast<double>(o.vocab + o.block_size) * o.n_embd;
  const double flops_per_token = 6.0 * (static_cast<double>(params) - embedding_params) +
                                 12.0 * o.n_layer * o.n_embd * o.block_size;
  const double model_flops = flops_per_token * static_cast<double>(tokens) / step.median;

  // ---- the step's GEMMs, each shape alone: per block qkv, proj, fc, fc2;
  // then the head.
  const int64_t rows = int64_t{o.batch} * o.block_size, c = o.n_embd;
  double gemm_s = 0;
  for (auto [in, out] : {std::pair{c, 3 * c}, {c, c}, {c, 4 * c}, {4 * c, c}}) {
    const LinearTimes t = TimeLinear(*be, o.dtype, rows, in, out);
    gemm_s += o.n_layer * (t.forward_s + t.backward_s);
  }
  const LinearTimes head = TimeLinear(*be, o.dtype, rows, c, o.vocab);
  gemm_s += head.forward_s + head.backward_s;
  gemm_s *= o.micro_batches;
  const double gemm_share = gemm_s / step.median;

  // ---- the other ops of the step, each alone at the step's shapes, per step.
  const Tensor x = Filled(*be, o.dtype, {rows, c}, 1.0f),
               dx = Filled(*be, o.dtype, {rows, c}, 1.0f);
  const Tensor gamma = Filled(*be, o.dtype, {c}, 1.0f), beta = Filled(*be, o.dtype, {c}, 0.1f);
  Tensor dgamma = be->Zeros(DType::kFloat32, {c}), dbeta = be->Zeros(DType::kFloat32, {c});
  Tensor mean = be->Empty(DType::kFloat32, {rows}), rstd = be->Empty(DType::kFloat32, {rows});
  const double layer_norm_s =
      TimeDevice(*be, 2, 5,
                 [&] {
                   (void)be->LayerNorm(x, gamma, beta, 1e-5f, mean, rstd);
                   (void)be->LayerNormBackward(x, gamma, mean, rstd, dx, dgamma, dbeta);
                 }) *
      (2 * o.n_layer + 1);
  const Tensor f = Filled(*be, o.dtype, {rows, 4 * c}, 2.0f);
  const double gelu_s =
      TimeDevice(*be, 2, 5, [&] { (void)be->GeluBackward(f, be->Gelu(f)); }) * o.n_layer;
  const double residual_s = TimeDevice(*be, 2, 5, [&] { (void)be->Add(x, dx); }) * 4 * o.n_layer;
  const Tensor qkv = Filled(*be, o.dtype, {rows, 3 * c}, 2.0f);
  Tensor lse = be->Empty(DType::kFloat32, {o.batch, o.n_head, o.block_size});
  const Tensor att_y = be->Attention(qkv, o.batch, o.n_head, lse);
  const double attention_forward_s =
      TimeDevice(*be, 2, 5, [&] { (void)be->Attention(qkv, o.batch, o.n_head, lse); }) * o.n_layer;
  const double attention_backward_s =
      TimeDevice(*be, 2, 5,
                 [&] { (void)be->AttentionBackward(qkv, att_y, lse, dx, o.batch, o.n_head); }) *
      o.n_layer;
  std::vector<int32_t> targets(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) targets[i] = GpuBenchToken(1, 0, i + 1, o.vocab);
  const Tensor logits = Filled(*be, o.dtype, {rows, o.vocab}, 4.0f);
  const double cross_entropy_s = TimeDevice(*be, 1, 3, [&] {
    (void)be->CrossEntropy(logits, targets);
    (void)be->CrossEntropyBackward(logits, targets, 1.0f);
  });
  const nlohmann::json parts = {{"gemm_s", gemm_s / o.micro_batches},
                                {"attention_forward_s", attention_forward_s},
                                {"attention_backward_s", attention_backward_s},
                                {"layer_norm_s", layer_norm_s},
                                {"gelu_s", gelu_s},
                                {"residual_add_s", residual_s},
                                {"cross_entropy_s", cross_entropy_s}};

  const nlohmann::json gemm_row = {
      {"workload", "gpu_gemm"}, {"device", be->name()},        {"dtype", dtype},
      {"size", o.gemm_size},    {"tflops", peak_flops / 1e12}, {"gemm_share_of_step", gemm_share}};
  const nlohmann::json step_row = {
      {"workload", "gpu_step"},
      {"device", be->name()},
      {"dtype", dtype},
      {"params", params},
      {"tokens_per_step", tokens},
      {"step_s", step.median},
      {"step_s_min", step.min},
      {"step_s_max", step.max},
      {"tokens_per_s", static_cast<double>(tokens) / step.median},
      {"model_tflops", model_flops / 1e12},
      {"ratio", model_flops / peak_flops},  // MFU against the measured peak; target 0.45
      {"first_loss", first_loss},
      {"seed", o.seed},
      {"parts_per_micro_batch", parts}};
  if (o.json) {
    out << gemm_row.dump() << "\n" << step_row.dump() << "\n";
  } else {
    out << absl::StrFormat(
        "gpu_gemm  %s %lld^3 GEMM: %.0f TFLOP/s (the peak below); the step's GEMMs alone take "
        "%.0f%% of its time\n",
        dtype, static_cast<long long>(o.gemm_size), peak_flops / 1e12, 100 * gemm_share);
    out << absl::StrFormat(
        "gpu_step  GPT %.1fM params, %lld tokens: %.1f ms (%.1f..%.1f), %.0f tokens/s, %.0f "
        "model TFLOP/s, MFU %.2f of the measured peak (target 0.45); step 1 loss %.4f\n",
        params / 1e6, static_cast<long long>(tokens), step.median * 1e3, step.min * 1e3,
        step.max * 1e3, tokens / step.median, model_flops / 1e12, model_flops / peak_flops,
        first_loss);
    out << "gpu_step  per micro-batch, each op alone: " << parts.dump() << "\n";
  }
  for (const bool dpu : {true, false}) {
    if (!(dpu ? o.dpu : o.sync)) continue;
    ZO_ASSIGN_OR_RETURN(const nlohmann::json row,
                        bench_internal::MeasureGpuOffloaded(o, *be, step.median, dpu));
    if (o.json) {
      out << row.dump() << "\n";
      continue;
    }
    out << absl::StrFormat(
        "%-9s with an embedded server%s: %.1f ms per step (compute alone %.1f, server alone "
        "%.1f; waits: weights %.1f, push %.1f): %.2f x compute alone (target <= 1.3), %.2f x "
        "the slower of the two\n",
        row["workload"].get<std::string>(), dpu ? " and DPU" : "",
        row["step_s"].get<double>() * 1e3, row["compute_alone_s"].get<double>() * 1e3,
        row["server_alone_s"].get<double>() * 1e3, row["step_wait_weights_s"].get<double>() * 1e3,
        row["step_wait_push_s"].get<double>() * 1e3, row["ratio"].get<double>(),
        row["ratio_to_slower"].get<double>());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunGpuBench(const GpuBenchOptions& o, std::ostream& out) {
  ZO_RETURN_IF_ERROR(ValidateGpuBenchOptions(o));
  // The step rows' backend is gone before gpu_largest needs the memory.
  if (o.step_rows) ZO_RETURN_IF_ERROR(RunStepRows(o, out));
  if (!o.largest) return absl::OkStatus();
  ZO_ASSIGN_OR_RETURN(const nlohmann::json largest, bench_internal::MeasureGpuLargest(o));
  if (o.json) {
    out << largest.dump() << "\n";
  } else {
    out << absl::StrFormat(
        "gpu_largest  GPT %.2fB params: loss %.4f -> %.4f over %d steps, %.1f s per step; peak "
        "GPU %.1f GiB, peak host RSS %.1f GiB (server state %.1f GiB)\n",
        largest["params"].get<double>() / 1e9, largest["first_loss"].get<double>(),
        largest["last_loss"].get<double>(), largest["steps"].get<int>(),
        largest["step_s"].get<double>(), largest["peak_gpu_bytes"].get<double>() / (1 << 30),
        largest["peak_host_rss_bytes"].get<double>() / (1 << 30),
        largest["server_ram_bytes_estimate"].get<double>() / (1 << 30));
  }
  return absl::OkStatus();
}

}  // namespace zo::bench
