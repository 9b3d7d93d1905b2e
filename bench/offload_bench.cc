#include "bench/offload_bench.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/internal/bench_stats.h"
#include "common/bf16.h"
#include "common/fp16.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "nlohmann/json.hpp"
#include "offload/aligned_buffer.h"
#include "offload/cpu_optimizer.h"
#include "offload/optimizer_kernels.h"
#include "offload/thread_pool.h"
#include "server/offload_server.h"
#include "worker/client/offload_client.h"

namespace zo::bench {
namespace {

// Tensors the parameters are cut into: a model's worth of pushes and
// pulls, each tensor a span of the chunks.
constexpr int kTensors = 16;

using bench_internal::Median;
using bench_internal::SecondsSince;

std::string JobConfig(DType dtype, int64_t chunk_elems) {
  const char* precision = dtype == DType::kFloat16    ? R"("fp16": {"enabled": true},)"
                          : dtype == DType::kBFloat16 ? R"("bf16": {"enabled": true},)"
                                                      : "";
  return absl::StrCat(R"({"train_batch_size": 1, )", precision, R"(
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
      "zo": {"chunk_elems": )",
                      chunk_elems, "}}");
}

// The server's update alone: the fused Adam over the same number of
// elements in RAM, with the same threads, reading gradients of the job's
// dtype and writing no copy (a job serving from its master writes none).
class AdamAlone {
 public:
  static absl::StatusOr<std::unique_ptr<AdamAlone>> Create(int64_t n, DType dtype, int threads,
                                                           int64_t chunk_elems) {
    auto a = std::unique_ptr<AdamAlone>(new AdamAlone(threads));
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    ZO_ASSIGN_OR_RETURN(a->p_, AlignedBuffer::Allocate(bytes));
    ZO_ASSIGN_OR_RETURN(a->m_, AlignedBuffer::Allocate(bytes));
    ZO_ASSIGN_OR_RETURN(a->v_, AlignedBuffer::Allocate(bytes));
    ZO_ASSIGN_OR_RETURN(a->g_, AlignedBuffer::Allocate(static_cast<size_t>(n) * DTypeSize(dtype)));
    std::vector<OptimizerChunk> chunks;
    for (int64_t begin = 0; begin < n; begin += chunk_elems) {
      const int64_t len = std::min(chunk_elems, n - begin);
      chunks.push_back({.p = static_cast<float*>(a->p_.data()) + begin,
                        .m = static_cast<float*>(a->m_.data()) + begin,
                        .v = static_cast<float*>(a->v_.data()) + begin,
                        .grad = OffsetBy(TypedConstPtr{a->g_.data(), dtype}, begin),
                        .low_precision = {},
                        .n = static_cast<size_t>(len)});
    }
    a->opt_ = std::make_unique<CpuOptimizer>(&a->pool_, std::move(chunks));
    a->opt_->FirstTouchZero();
    return a;
  }

  double Step() {
    const auto start = std::chrono::steady_clock::now();
    opt_->AdamStep(MakeAdamStepConstants(hp_, ++step_, 1.0));
    return SecondsSince(start);
  }

 private:
  explicit AdamAlone(int threads) : pool_(threads) { hp_.weight_decay = 0.01; }
  ThreadPool pool_;
  AlignedBuffer p_, m_, v_, g_;
  std::unique_ptr<CpuOptimizer> opt_;
  AdamHyperParams hp_;
  int64_t step_ = 0;
};

struct RouteResult {
  std::string route;
  double step_s = 0;
  double push_s = 0;  // every push in and acknowledged
  double pull_s = 0;  // from then to the last weight pulled: the update and the pull
  double adam_s = 0;
  double ratio = 0;
};

absl::StatusOr<RouteResult> MeasureRoute(const OffloadBenchOptions& o, const std::string& route,
                                         AdamAlone& adam) {
  ServerOptions server_options;
  const bool over_tcp = route == "tcp" || route == "same_host";
  server_options.listen = over_tcp ? "127.0.0.1:0" : "";
  server_options.threads = o.threads;
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<OffloadServer> server, OffloadServer::Start(server_options));
  ClientOptions options;
  options.job = absl::StrCat("bench-offload-", route);
  if (over_tcp) {
    options.servers = {absl::StrCat("127.0.0.1:", server->port())};
    options.shared_memory = route == "same_host";
  } else {
    options.channels = {server->InProcessChannel()};
    if (route == "in_process") options.routes = {server->DataRoute()};
  }
  std::vector<TensorSpec> manifest;
  const int64_t per_tensor = (o.params + kTensors - 1) / kTensors;
  for (int64_t begin = 0, t = 0; begin < o.params; begin += per_tensor, ++t) {
    manifest.push_back({.name = absl::StrCat("w", t),
                        .shape = {std::min(per_tensor, o.params - begin)},
                        .dtype = o.dtype});
  }
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<OffloadClient> client,
                      OffloadClient::Open(options, JobConfig(o.dtype, o.chunk_elems), manifest));
  if (route == "same_host" && client->routes()[0] != "shared_memory") {
    return absl::FailedPreconditionError(
        "offload: same_host: the server did not map the shared region (see the log)");
  }

  // Gradients (small and finite, so no step is skipped) and the weights'
  // buffers, touched before timing; the pushes borrow the gradients.
  const size_t elem = DTypeSize(o.dtype);
  auto grads = std::make_shared<std::vector<std::vector<std::byte>>>();
  std::vector<std::vector<std::byte>> weights;
  std::vector<absl::Span<std::byte>> dst;
  std::vector<int> tensors;
  for (size_t t = 0; t < manifest.size(); ++t) {
    const int64_t n = manifest[t].shape[0];
    std::vector<std::byte>& g = grads->emplace_back(static_cast<size_t>(n) * elem);
    for (int64_t i = 0; i < n; ++i) {
      const float x = 1e-3f * static_cast<float>((i * 7919 + static_cast<int64_t>(t)) % 997 - 498);
      if (o.dtype == DType::kFloat32) {
        std::memcpy(&g[i * 4], &x, 4);
      } else {
        const uint16_t h = o.dtype == DType::kFloat16 ? FloatToHalfBits(x) : FloatToBf16Bits(x);
        std::memcpy(&g[i * 2], &h, 2);
      }
    }
    weights.emplace_back(static_cast<size_t>(n) * elem, std::byte{1});
    dst.push_back(absl::MakeSpan(weights.back()));
    tensors.push_back(static_cast<int>(t));
  }

  int64_t step = 0;
  auto one_step = [&](RouteResult* r) -> absl::Status {
    ++step;
    const auto start = std::chrono::steady_clock::now();
    for (size_t t = 0; t < manifest.size(); ++t) {
      ZO_RETURN_IF_ERROR(
          client->PushShared(step, static_cast<int>(t), grads, absl::MakeConstSpan((*grads)[t])));
    }
    ZO_RETURN_IF_ERROR(client->FinishStep(step));
    const double pushed = SecondsSince(start);
    ZO_RETURN_IF_ERROR(client->Pull(step, -1, tensors, dst).status());
    if (r != nullptr) {
      r->step_s = SecondsSince(start);
      r->push_s = pushed;
      r->pull_s = r->step_s - pushed;
    }
    return absl::OkStatus();
  };
  ZO_RETURN_IF_ERROR(one_step(nullptr));  // warm-up: first touch of the server's state
  adam.Step();
  std::vector<double> step_s, push_s, pull_s, adam_s;
  for (int i = 0; i < o.rounds; ++i) {
    std::cerr << "offload: " << route << ": round " << i + 1 << " of " << o.rounds << "\n";
    RouteResult r;
    // Alternating which goes first, so neither always runs on a warm cache.
    if (i % 2 == 1) adam_s.push_back(adam.Step());
    ZO_RETURN_IF_ERROR(one_step(&r));
    if (i % 2 == 0) adam_s.push_back(adam.Step());
    step_s.push_back(r.step_s);
    push_s.push_back(r.push_s);
    pull_s.push_back(r.pull_s);
  }
  client.reset();
  server->Shutdown(absl::Seconds(5));
  RouteResult result{.route = route,
                     .step_s = Median(step_s),
                     .push_s = Median(push_s),
                     .pull_s = Median(pull_s),
                     .adam_s = Median(adam_s)};
  result.ratio = result.step_s / result.adam_s;
  return result;
}

}  // namespace

absl::Status RunOffloadBench(const OffloadBenchOptions& options, std::ostream& out) {
  OffloadBenchOptions o = options;
  if (o.params < 1) return absl::InvalidArgumentError("--params must be >= 1");
  if (o.rounds < 1) return absl::InvalidArgumentError("--rounds must be >= 1");
  if (o.threads < 0) return absl::InvalidArgumentError("--threads must be >= 0");
  for (const std::string& r : o.routes) {
    if (r != "in_process" && r != "grpc_in_process" && r != "same_host" && r != "tcp") {
      return absl::InvalidArgumentError(absl::StrCat(
          "offload: unknown route '", r, "' (in_process, grpc_in_process, same_host or tcp)"));
    }
  }
  if (o.threads == 0) o.threads = ThreadPool::DefaultSize();
  std::cerr << "offload: " << FormatCount(static_cast<double>(o.params)) << " params, "
            << DTypeName(o.dtype) << ", " << o.threads << " threads: mapping the Adam's arrays\n";
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<AdamAlone> adam,
                      AdamAlone::Create(o.params, o.dtype, o.threads, o.chunk_elems));
  if (!o.json) {
    out << absl::StrFormat(
        "offload: %d params (%s), %s, %d optimizer threads, %d rounds (median)\n"
        "step = push every gradient + the servers' update + pull every weight, no compute;\n"
        "adam = the fused Adam alone over as many elements, same threads, same run; "
        "ratio = step / adam\n\n%-16s %10s %10s %10s %10s %7s\n",
        o.params, FormatCount(static_cast<double>(o.params)), std::string(DTypeName(o.dtype)),
        o.threads, o.rounds, "route", "step ms", "push ms", "upd+pull", "adam ms", "ratio");
  }
  for (const std::string& route : o.routes) {
    ZO_ASSIGN_OR_RETURN(const RouteResult r, MeasureRoute(o, route, *adam));
    if (o.json) {
      out << nlohmann::json{{"bench", "offload"},
                            {"route", r.route},
                            {"dtype", std::string(DTypeName(o.dtype))},
                            {"params", o.params},
                            {"threads", o.threads},
                            {"step_s", r.step_s},
                            {"push_s", r.push_s},
                            {"update_pull_s", r.pull_s},
                            {"adam_s", r.adam_s},
                            {"ratio", r.ratio}}
                 .dump()
          << "\n";
    } else {
      out << absl::StrFormat("%-16s %10.1f %10.1f %10.1f %10.1f %7.2f\n", r.route, 1e3 * r.step_s,
                             1e3 * r.push_s, 1e3 * r.pull_s, 1e3 * r.adam_s, r.ratio);
    }
    out.flush();
  }
  return absl::OkStatus();
}

}  // namespace zo::bench
