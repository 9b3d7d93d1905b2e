#include "bench/offload_bench.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/internal/bench_stats.h"
#include "common/bf16.h"
#include "common/dpu_policy.h"
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

// How the servers update: with a delayed parameter update, and whether
// they speculate (zo.speculative_update; a job with DPU does not).
struct UpdateMode {
  bool dpu = false;
  bool speculative = true;
  // zo.dpu.compensation "worker": a delayed step waits for the step
  // before's decision (GetStepCompensation) before it computes.
  bool compensated = false;
};

// `micro_batches` > 1: each step pushes that many gradients per tensor,
// summed on the servers (zo.gradient_accumulation "servers").
std::string JobConfig(DType dtype, int64_t chunk_elems, UpdateMode mode, int micro_batches,
                      int connections) {
  const char* precision = dtype == DType::kFloat16    ? R"("fp16": {"enabled": true},)"
                          : dtype == DType::kBFloat16 ? R"("bf16": {"enabled": true},)"
                                                      : "";
  return absl::StrCat(
      R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": )", micro_batches,
      ", ", precision, R"(
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
      "zo": {)",
      micro_batches > 1 ? R"("gradient_accumulation": "servers", )" : "", R"("chunk_elems": )",
      chunk_elems, R"(, "connections_per_server": )", connections, R"(, "speculative_update": )",
      mode.speculative ? "true" : "false", R"(, "dpu": {"enabled": )", mode.dpu ? "true" : "false",
      R"(, "warmup_steps": 0, "compensation": ")", mode.compensated ? "worker" : "none", R"("}}})");
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

// A job on a server of its own reached through one route, with a model's
// worth of gradients to push and buffers for its weights.
class BenchJob {
 public:
  static absl::StatusOr<std::unique_ptr<BenchJob>> Open(const OffloadBenchOptions& o,
                                                        const std::string& route, UpdateMode mode) {
    auto job = std::unique_ptr<BenchJob>(new BenchJob());
    ServerOptions server_options;
    const bool over_tcp = route == "tcp" || route == "same_host";
    server_options.listen = over_tcp ? "127.0.0.1:0" : "";
    server_options.threads = o.threads;
    ZO_ASSIGN_OR_RETURN(job->server_, OffloadServer::Start(server_options));
    ClientOptions options;
    options.applies_dpu_compensation = mode.compensated;
    options.job = absl::StrCat("bench-offload-", route, mode.dpu ? "-dpu" : "",
                               mode.speculative ? "-speculative" : "",
                               mode.compensated ? "-compensated" : "");
    if (over_tcp) {
      options.servers = {absl::StrCat("127.0.0.1:", job->server_->port())};
      options.shared_memory = route == "same_host";
    } else {
      options.channels = {job->server_->InProcessChannel()};
      if (route == "in_process") options.routes = {job->server_->DataRoute()};
    }
    const int64_t per_tensor = (o.params + kTensors - 1) / kTensors;
    for (int64_t begin = 0, t = 0; begin < o.params; begin += per_tensor, ++t) {
      job->manifest_.push_back({.name = absl::StrCat("w", t),
                                .shape = {std::min(per_tensor, o.params - begin)},
                                .dtype = o.dtype});
    }
    ZO_ASSIGN_OR_RETURN(job->client_, OffloadClient::Open(options,
                                                          JobConfig(o.dtype, o.chunk_elems, mode,
                                                                    o.micro_batches, o.connections),
                                                          job->manifest_));
    if (route == "same_host" && job->client_->routes()[0] != "shared_memory") {
      return absl::FailedPreconditionError(
          "offload: same_host: the server did not map the shared region (see the log)");
    }
    job->FillBuffers(o.dtype);
    if (route == "same_host") {
      // As zo-train pulls: into the region, where the server writes.
      std::vector<absl::Span<std::byte>> lent = job->client_->RegionPullBuffers(job->all_tensors_);
      if (!lent.empty()) job->dst_ = std::move(lent);
    }
    job->lends_pushes_ = route == "same_host" || route == "in_process";
    for (std::vector<bool>& written : job->lent_written_) {
      written.assign(job->manifest_.size(), false);
    }
    return job;
  }

  ~BenchJob() {
    client_.reset();
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(5));
  }

  int tensors() const { return static_cast<int>(manifest_.size()); }
  // Every micro-batch pushes the same gradients: the bytes moved and summed
  // are what matter here. On the in-process and same-host routes they are
  // where zo-train's backward puts them, where the server reads them
  // (PushBuffers: the embedded server's buffer, the region's gradient
  // areas): written there once per area, as a backward's copy would leave
  // them, so the push copies nothing more.
  absl::Status Push(int64_t step, int tensor, int micro_batch) {
    if (lends_pushes_) {
      const std::vector<int> one = {tensor};
      ZO_ASSIGN_OR_RETURN(std::vector<absl::Span<std::byte>> lent, client_->PushBuffers(step, one));
      if (!lent.empty()) {
        std::vector<bool>& written = lent_written_[step % 2];
        if (!written[static_cast<size_t>(tensor)]) {
          const std::vector<std::byte>& g = (*grads_)[static_cast<size_t>(tensor)];
          std::memcpy(lent[0].data(), g.data(), g.size());
          written[static_cast<size_t>(tensor)] = true;
        }
        return client_->PushShared(step, tensor, grads_, lent[0], micro_batch);
      }
    }
    return client_->PushShared(step, tensor, grads_, absl::MakeConstSpan((*grads_)[tensor]),
                               micro_batch);
  }
  absl::Status FinishStep(int64_t step) { return client_->FinishStep(step); }
  absl::Status AwaitCompensation(int64_t step) {
    return client_->StepCompensation(step, true).status();
  }
  absl::Status Pull(int64_t version) {
    return client_->Pull(version, -1, all_tensors_, dst_).status();
  }
  absl::Status PullTensor(int64_t version, int tensor) {
    const std::vector<int> one = {tensor};
    const std::vector<absl::Span<std::byte>> into = {dst_[static_cast<size_t>(tensor)]};
    return client_->Pull(version, -1, one, into).status();
  }

 private:
  BenchJob() = default;

  // Gradients (small and finite, so no step is skipped) and the weights'
  // buffers, touched before timing; the pushes borrow the gradients.
  void FillBuffers(DType dtype) {
    const size_t elem = DTypeSize(dtype);
    grads_ = std::make_shared<std::vector<std::vector<std::byte>>>();
    for (size_t t = 0; t < manifest_.size(); ++t) {
      const int64_t n = manifest_[t].shape[0];
      std::vector<std::byte>& g = grads_->emplace_back(static_cast<size_t>(n) * elem);
      for (int64_t i = 0; i < n; ++i) {
        const float x =
            1e-3f * static_cast<float>((i * 7919 + static_cast<int64_t>(t)) % 997 - 498);
        if (dtype == DType::kFloat32) {
          std::memcpy(&g[i * 4], &x, 4);
        } else {
          const uint16_t h = dtype == DType::kFloat16 ? FloatToHalfBits(x) : FloatToBf16Bits(x);
          std::memcpy(&g[i * 2], &h, 2);
        }
      }
      weights_.emplace_back(static_cast<size_t>(n) * elem, std::byte{1});
      dst_.push_back(absl::MakeSpan(weights_.back()));
      all_tensors_.push_back(static_cast<int>(t));
    }
  }

  std::unique_ptr<OffloadServer> server_;
  std::unique_ptr<OffloadClient> client_;
  std::vector<TensorSpec> manifest_;
  std::shared_ptr<std::vector<std::vector<std::byte>>> grads_;
  std::vector<std::vector<std::byte>> weights_;
  std::vector<absl::Span<std::byte>> dst_;
  std::vector<int> all_tensors_;
  // The in-process and same-host routes: gradients pushed from where the
  // server reads them, and per area (step % 2) the tensors already written
  // there.
  bool lends_pushes_ = false;
  std::vector<bool> lent_written_[2];
};

absl::StatusOr<RouteResult> MeasureRoute(const OffloadBenchOptions& o, const std::string& route,
                                         AdamAlone& adam) {
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<BenchJob> job, BenchJob::Open(o, route, UpdateMode{}));
  int64_t step = 0;
  auto one_step = [&](RouteResult* r) -> absl::Status {
    ++step;
    const auto start = std::chrono::steady_clock::now();
    for (int mb = 0; mb < o.micro_batches; ++mb) {
      for (int t = 0; t < job->tensors(); ++t) ZO_RETURN_IF_ERROR(job->Push(step, t, mb));
    }
    ZO_RETURN_IF_ERROR(job->FinishStep(step));
    const double pushed = SecondsSince(start);
    ZO_RETURN_IF_ERROR(job->Pull(step));
    if (r != nullptr) {
      r->step_s = SecondsSince(start);
      r->push_s = pushed;
      r->pull_s = r->step_s - pushed;
    }
    return absl::OkStatus();
  };
  // Warm-up: the first touch of the server's state, and of both gradient
  // areas.
  ZO_RETURN_IF_ERROR(one_step(nullptr));
  ZO_RETURN_IF_ERROR(one_step(nullptr));
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
  RouteResult result{.route = route,
                     .step_s = Median(step_s),
                     .push_s = Median(push_s),
                     .pull_s = Median(pull_s),
                     .adam_s = Median(adam_s)};
  result.ratio = result.step_s / result.adam_s;
  return result;
}

// The backward's pushes, on a thread of their own as zo-train's are
// (OffloadLink pushes when a gradient's copy completes, beside the
// compute): the compute does not wait for them.
class BackgroundPushes {
 public:
  explicit BackgroundPushes(BenchJob* job) : job_(job), thread_([this] { Run(); }) {}
  ~BackgroundPushes() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    queued_.notify_all();
    thread_.join();
  }

  void Push(int64_t step, int tensor, int micro_batch) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back({step, tensor, micro_batch});
    }
    queued_.notify_all();
  }
  // Waits for every push queued; the first one's error since the last Drain.
  absl::Status Drain() {
    std::unique_lock lock(mu_);
    drained_.wait(lock, [this] { return queue_.empty() && !pushing_; });
    return std::exchange(error_, absl::OkStatus());
  }

 private:
  void Run() {
    std::unique_lock lock(mu_);
    for (;;) {
      queued_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      const Queued next = queue_.front();
      queue_.pop_front();
      pushing_ = true;
      const bool failed = !error_.ok();
      lock.unlock();
      absl::Status pushed =
          failed ? absl::OkStatus() : job_->Push(next.step, next.tensor, next.micro_batch);
      lock.lock();
      pushing_ = false;
      if (error_.ok()) error_ = std::move(pushed);
      drained_.notify_all();
    }
  }

  struct Queued {
    int64_t step;
    int tensor;
    int micro_batch;
  };
  BenchJob* job_;
  std::mutex mu_;
  std::condition_variable queued_, drained_;
  std::deque<Queued> queue_;
  bool pushing_ = false;
  bool stop_ = false;
  absl::Status error_;
  std::thread thread_;  // last: starts once the rest is made
};

struct OverlapResult {
  UpdateMode mode;
  bool per_tensor = false;  // the forward waited for each tensor's pull
  double step_s = 0;
};

// Steps around a simulated compute of `compute_s`, as a worker takes
// them: it has the version its step computes on (the step before's; with
// DPU the one before that), starts pulling the next step's version in the
// background at once, in one pull (or, --overlap-pulls tensor, a pull per
// tensor; the servers make it from this step's gradients; with DPU they
// are applying it), idles through a third of the compute (the forward, a
// slice per tensor, each after its tensor's weights are in: a forward
// needs layer 0's weights first, and a pull of them alone may be answered
// before the rest of the version is written), then through the rest in
// one slice per tensor, handing each tensor's gradients after its slice
// to BackgroundPushes, last tensor
// first (the backward, which makes them in that order), and ends the step
// once they are all pushed. Its length is from the wait for its first
// weights to the acknowledgement, the next step's following at once.
absl::StatusOr<OverlapResult> MeasureOverlap(const OffloadBenchOptions& o, const std::string& route,
                                             UpdateMode mode, double compute_s) {
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<BenchJob> job, BenchJob::Open(o, route, mode));
  const DpuConfig policy{.enabled = mode.dpu, .warmup_steps = 0};
  // The compute runs as a GPU's stream does: each slice ends its length
  // after the later of the previous slice's end and its weights' arrival,
  // however late this thread wakes on a busy CPU (sleeping slice by slice
  // added every wake-up's delay: up to a third of the backward, with the
  // servers' update on both cores).
  using Clock = std::chrono::steady_clock;
  Clock::time_point device = Clock::now();
  const auto compute = [&](double s) {
    device += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
    std::this_thread::sleep_until(device);
  };
  // Per micro-batch: a forward, then a backward slice per tensor.
  const double forward_s = compute_s / 3 / o.micro_batches;
  const double slice_s = compute_s * 2 / 3 / job->tensors() / o.micro_batches;
  // With DPU the worker takes whole versions before its forward (below):
  // pulling them a tensor at a time would only take threads.
  const bool per_tensor = o.pull_per_tensor && !mode.dpu;
  // Two untimed steps: the first touch of the server's state, and with DPU
  // the first step that computes on an older version.
  constexpr int kWarmup = 2;
  // The next step's version: one pull, or one per tensor.
  std::vector<std::future<absl::Status>> prefetch;
  int64_t prefetched = -1;
  std::vector<std::future<absl::Status>> pulls;  // this step's
  absl::Cleanup join = [&] {
    for (auto* futures : {&prefetch, &pulls}) {
      for (std::future<absl::Status>& f : *futures) {
        if (f.valid()) f.wait();
      }
    }
  };
  std::vector<double> step_s;
  BackgroundPushes pushes(job.get());
  for (int64_t step = 1; step <= kWarmup + o.rounds; ++step) {
    if (step > kWarmup) {
      std::cerr << "offload: " << route << ": overlap, dpu "
                << (!mode.dpu          ? "off"
                    : mode.compensated ? "compensated"
                                       : "on")
                << ", speculative " << (mode.speculative ? "on" : "off") << ": round "
                << step - kWarmup << " of " << o.rounds << "\n";
    }
    const auto start = std::chrono::steady_clock::now();
    const int64_t version = VersionForStep(policy, step);
    pulls.clear();
    if (std::exchange(prefetched, -1) == version) {
      pulls = std::exchange(prefetch, {});
    } else {
      ZO_RETURN_IF_ERROR(job->Pull(version));
    }
    // With DPU the worker combines whole versions (compensated) or has
    // them by now: it takes them all before its forward. The combine
    // itself is left out: on a GPU it reads 10 B per parameter at device
    // bandwidth, a small fraction of a millisecond here.
    if (mode.dpu) {
      for (std::future<absl::Status>& f : pulls) ZO_RETURN_IF_ERROR(f.get());
      pulls.clear();
    }
    if (mode.compensated && version == step - 2)
      ZO_RETURN_IF_ERROR(job->AwaitCompensation(step - 1));
    device = Clock::now();  // what came before the compute was waited for
    // The next step's pulls wait for its version from now on: on the
    // in-process route a speculative update fills them as it goes.
    if (const int64_t next = VersionForStep(policy, step + 1); next <= step) {
      if (per_tensor) {
        for (int t = 0; t < job->tensors(); ++t) {
          prefetch.push_back(
              std::async(std::launch::async, [&job, next, t] { return job->PullTensor(next, t); }));
        }
      } else {
        prefetch.push_back(
            std::async(std::launch::async, [&job, next] { return job->Pull(next); }));
      }
      prefetched = next;
    }
    for (int mb = 0; mb < o.micro_batches; ++mb) {
      for (int t = 0; t < job->tensors(); ++t) {
        // Tensor t's weights: its own pull's, or the whole version's.
        const size_t pull = per_tensor ? static_cast<size_t>(t) : 0;
        if (pull < pulls.size() && pulls[pull].valid()) {
          ZO_RETURN_IF_ERROR(pulls[pull].get());
          device = std::max(device, Clock::now());
        }
        compute(forward_s / job->tensors());
      }
      pulls.clear();
      for (int t = job->tensors() - 1; t >= 0; --t) {
        compute(slice_s);
        pushes.Push(step, t, mb);
      }
    }
    ZO_RETURN_IF_ERROR(pushes.Drain());
    ZO_RETURN_IF_ERROR(job->FinishStep(step));
    if (step > kWarmup) step_s.push_back(SecondsSince(start));
  }
  return OverlapResult{.mode = mode, .per_tensor = per_tensor, .step_s = Median(step_s)};
}

// The route's overlap rows: the synchronous update, the same with the
// speculative update (each chunk updated as its gradients come in), and
// the delayed parameter update (which does not speculate: its update is
// off the step's path already).
absl::Status ReportOverlap(const OffloadBenchOptions& o, const std::string& route,
                           double servers_step_s, std::ostream& out) {
  const double compute_s = o.compute_ms > 0 ? o.compute_ms / 1e3 : servers_step_s;
  for (const UpdateMode mode :
       {UpdateMode{.dpu = false, .speculative = false},
        UpdateMode{.dpu = false, .speculative = true},
        UpdateMode{.dpu = true, .speculative = false},
        UpdateMode{.dpu = true, .speculative = false, .compensated = true}}) {
    ZO_ASSIGN_OR_RETURN(const OverlapResult r, MeasureOverlap(o, route, mode, compute_s));
    const double ratio = r.step_s / std::max(compute_s, servers_step_s);
    if (o.json) {
      out << nlohmann::json{{"bench", "offload"},
                            {"row", "overlap"},
                            {"route", route},
                            {"dtype", std::string(DTypeName(o.dtype))},
                            {"params", o.params},
                            {"threads", o.threads},
                            {"micro_batches", o.micro_batches},
                            {"connections", o.connections},
                            {"speculative", r.mode.speculative},
                            {"dpu", r.mode.dpu},
                            {"compensated", r.mode.compensated},
                            {"pulls", r.per_tensor ? "tensor" : "version"},
                            {"compute_s", compute_s},
                            {"servers_step_s", servers_step_s},
                            {"step_s", r.step_s},
                            {"ratio", ratio}}
                 .dump()
          << "\n";
    } else {
      out << absl::StrFormat(
          "%-16s %10.1f  overlap: compute %.1f ms, dpu %s, speculative %s, pulls per %s, %.2f x "
          "max(compute, step alone)\n",
          route, 1e3 * r.step_s, 1e3 * compute_s,
          !r.mode.dpu          ? "off"
          : r.mode.compensated ? "compensated"
                               : "on",
          r.mode.speculative ? "on" : "off", r.per_tensor ? "tensor" : "version", ratio);
    }
    out.flush();
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunOffloadBench(const OffloadBenchOptions& options, std::ostream& out) {
  OffloadBenchOptions o = options;
  if (o.params < 1) return absl::InvalidArgumentError("--params must be >= 1");
  if (o.rounds < 1) return absl::InvalidArgumentError("--rounds must be >= 1");
  if (o.threads < 0) return absl::InvalidArgumentError("--threads must be >= 0");
  if (o.compute_ms < 0) return absl::InvalidArgumentError("--compute-ms must be >= 0");
  if (o.micro_batches < 1) return absl::InvalidArgumentError("--micro-batches must be >= 1");
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
        "offload: %d params (%s), %s, %d optimizer threads, %d rounds (median), %d micro-batches\n"
        "step = push every gradient (once per micro-batch) + the servers' update + pull every "
        "weight, no compute;\n"
        "adam = the fused Adam alone over as many elements, same threads, same run; "
        "ratio = step / adam\n\n%-16s %10s %10s %10s %10s %7s\n",
        o.params, FormatCount(static_cast<double>(o.params)), std::string(DTypeName(o.dtype)),
        o.threads, o.rounds, o.micro_batches, "route", "step ms", "push ms", "upd+pull", "adam ms",
        "ratio");
  }
  for (const std::string& route : o.routes) {
    ZO_ASSIGN_OR_RETURN(const RouteResult r, MeasureRoute(o, route, *adam));
    if (o.json) {
      out << nlohmann::json{{"bench", "offload"},
                            {"row", "step"},
                            {"route", r.route},
                            {"dtype", std::string(DTypeName(o.dtype))},
                            {"params", o.params},
                            {"threads", o.threads},
                            {"step_s", r.step_s},
                            {"push_s", r.push_s},
                            {"update_pull_s", r.pull_s},
                            {"adam_s", r.adam_s},
                            {"ratio", r.ratio},
                            {"speculative", true},
                            {"micro_batches", o.micro_batches},
                            {"connections", o.connections}}
                 .dump()
          << "\n";
    } else {
      out << absl::StrFormat("%-16s %10.1f %10.1f %10.1f %10.1f %7.2f\n", r.route, 1e3 * r.step_s,
                             1e3 * r.push_s, 1e3 * r.pull_s, 1e3 * r.adam_s, r.ratio);
    }
    out.flush();
    if (o.overlap) ZO_RETURN_IF_ERROR(ReportOverlap(o, route, r.step_s, out));
  }
  return absl::OkStatus();
}

}  // namespace zo::bench
