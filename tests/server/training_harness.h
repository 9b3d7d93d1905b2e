// Drives real zo-server processes with dp workers that train a
// LeastSquares problem through the client library, one thread per dp rank.
#ifndef ZO_TESTS_SERVER_TRAINING_HARNESS_H_
#define ZO_TESTS_SERVER_TRAINING_HARNESS_H_

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "tests/server/least_squares.h"
#include "tests/server/server_process.h"
#include "worker/client/offload_client.h"

namespace zo::testing {

inline std::vector<TensorSpec> ManifestOf(const LeastSquares& p, DType dtype) {
  std::vector<TensorSpec> manifest;
  for (size_t t = 0; t < p.tensor_sizes.size(); ++t) {
    manifest.push_back({.name = absl::StrCat("layer", t, ".weight"),
                        .shape = {p.tensor_sizes[t]},
                        .dtype = dtype});
  }
  return manifest;
}

inline std::vector<float> ToFloats(DType dtype, const std::vector<std::byte>& bytes) {
  std::vector<float> out(bytes.size() / DTypeSize(dtype));
  for (size_t i = 0; i < out.size(); ++i) {
    if (dtype == DType::kFloat32) {
      std::memcpy(&out[i], &bytes[i * 4], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &bytes[i * 2], 2);
      out[i] = dtype == DType::kFloat16 ? HalfBitsToFloat(h) : Bf16BitsToFloat(h);
    }
  }
  return out;
}

inline std::vector<std::byte> FromFloats(DType dtype, const float* v, size_t n) {
  std::vector<std::byte> out(n * DTypeSize(dtype));
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::kFloat32) {
      std::memcpy(&out[i * 4], &v[i], 4);
    } else {
      const uint16_t h = dtype == DType::kFloat16 ? FloatToHalfBits(v[i]) : FloatToBf16Bits(v[i]);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

// One dp rank.
class Worker {
 public:
  Worker(const LeastSquares& p, int rank, DType dtype, std::unique_ptr<OffloadClient> client)
      : p_(p), rank_(rank), dtype_(dtype), client_(std::move(client)) {}

  OffloadClient& client() { return *client_; }
  // Called with the step number once its gradients are pushed and before
  // FinishStep waits for the acks: lets a test act in the middle of a step.
  void set_after_push(std::function<void(int64_t)> hook) { after_push_ = std::move(hook); }
  // With zo.client_lr: each step's learning rate, sent before its pushes.
  void set_step_lr(std::function<double(int64_t)> lr) { step_lr_ = std::move(lr); }
  // Loss scale used by each step so far.
  const std::vector<double>& scales() const { return scales_; }

  absl::Status InitWeights() {
    for (size_t t = 0; t < p_.tensor_sizes.size(); ++t) {
      const int begin = p_.TensorBegin(static_cast<int>(t));
      ZO_RETURN_IF_ERROR(client_->InitParams(
          static_cast<int>(t), absl::MakeConstSpan(p_.x0.data() + begin, p_.tensor_sizes[t])));
    }
    return absl::OkStatus();
  }

  // The weights of `version` as floats.
  absl::StatusOr<std::vector<float>> PullAll(int64_t version) {
    std::vector<std::vector<std::byte>> buffers;
    std::vector<absl::Span<std::byte>> dst;
    std::vector<int> tensors;
    for (size_t t = 0; t < p_.tensor_sizes.size(); ++t) {
      buffers.emplace_back(p_.tensor_sizes[t] * DTypeSize(dtype_));
      tensors.push_back(static_cast<int>(t));
    }
    for (auto& b : buffers) dst.push_back(absl::MakeSpan(b));
    ZO_RETURN_IF_ERROR(client_->Pull(version, -1, tensors, dst).status());
    std::vector<float> x;
    for (auto& b : buffers) {
      std::vector<float> part = ToFloats(dtype_, b);
      x.insert(x.end(), part.begin(), part.end());
    }
    return x;
  }

  // Pulls the weights for `step` (DPU policy), pushes this rank's gradient
  // (Inf at element 0 when `overflow`) and waits for the servers' acks.
  absl::Status RunStep(int64_t step, bool overflow) {
    if (buffers_.empty()) {
      for (size_t t = 0; t < p_.tensor_sizes.size(); ++t) {
        buffers_.emplace_back(p_.tensor_sizes[t] * DTypeSize(dtype_));
        tensors_.push_back(static_cast<int>(t));
      }
    }
    std::vector<absl::Span<std::byte>> dst;
    for (auto& b : buffers_) dst.push_back(absl::MakeSpan(b));
    ZO_RETURN_IF_ERROR(client_->PullForStep(step, tensors_, dst).status());
    std::vector<float> x;
    for (auto& b : buffers_) {
      std::vector<float> part = ToFloats(dtype_, b);
      x.insert(x.end(), part.begin(), part.end());
    }
    const double scale = client_->loss_scale();
    scales_.push_back(scale);
    if (step_lr_) ZO_RETURN_IF_ERROR(client_->SetStepLr(step, std::vector<double>{step_lr_(step)}));
    const std::vector<double> g = p_.Gradient(rank_, x);
    std::vector<float> scaled(g.size());
    for (size_t i = 0; i < g.size(); ++i) scaled[i] = static_cast<float>(g[i] * scale);
    if (overflow) scaled[0] = std::numeric_limits<float>::infinity();
    for (size_t t = 0; t < p_.tensor_sizes.size(); ++t) {
      const int begin = p_.TensorBegin(static_cast<int>(t));
      const std::vector<std::byte> bytes =
          FromFloats(dtype_, scaled.data() + begin, p_.tensor_sizes[t]);
      ZO_RETURN_IF_ERROR(client_->Push(step, static_cast<int>(t), bytes));
    }
    if (after_push_) after_push_(step);
    return client_->FinishStep(step);
  }

 private:
  const LeastSquares& p_;
  const int rank_;
  const DType dtype_;
  std::unique_ptr<OffloadClient> client_;
  std::vector<std::vector<std::byte>> buffers_;
  std::vector<int> tensors_;
  std::vector<double> scales_;
  std::function<void(int64_t)> after_push_;
  std::function<double(int64_t)> step_lr_;
};

// Runs steps [first, last] on every worker in parallel; `overflow_steps`
// get an Inf from rank 0.
inline absl::Status RunSteps(std::vector<std::unique_ptr<Worker>>& workers, int64_t first,
                             int64_t last, const std::set<int64_t>& overflow_steps = {}) {
  std::vector<absl::Status> results(workers.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < workers.size(); ++r) {
    threads.emplace_back([&, r] {
      for (int64_t s = first; s <= last && results[r].ok(); ++s) {
        results[r] = workers[r]->RunStep(s, r == 0 && overflow_steps.count(s) > 0);
        if (!results[r].ok()) {
          results[r] = absl::Status(
              results[r].code(), absl::StrCat("rank ", r, " step ", s, ": ", results[r].message()));
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : results) ZO_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

// The job config the tests' double-precision Reference follows: AdamW (lr
// 0.01, weight decay 0.01), WarmupLR linear over 10 steps from 0, clipping
// at 0.5, 2 dp ranks of one micro-batch. `fields` adds top-level fields
// ("\"zo\": {...}"), comma-separated, no trailing comma.
inline std::string ReferenceJobConfig(const std::string& fields) {
  return absl::StrCat(R"({
    "train_batch_size": 2, "train_micro_batch_size_per_gpu": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8,
                                              "weight_decay": 0.01}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.01,
                                                 "warmup_num_steps": 10, "warmup_type": "linear"}},
    "gradient_clipping": 0.5,
    )",
                      fields, "}");
}

// The least-squares problem of the multi-server tests: 3 tensors (597
// elements), 64 rows per dp rank, 2 ranks.
inline LeastSquares ReferenceProblem() { return LeastSquares::Make({200, 333, 64}, 64, 2, 7); }

// An empty directory under the test temp dir, unique to this process.
inline std::string FreshTempDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/zo_", name, "_", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// `n` zo-server processes with `args`; a failed start fails the test.
// Asks `client` for its job's status until `done` holds for it; false if it
// never did within many asks (no clock: the calls themselves pace it).
inline bool JobStatusUntil(OffloadClient& client,
                           const std::function<bool(const v1::JobStatus&)>& done) {
  for (int i = 0; i < 200000; ++i) {
    absl::StatusOr<v1::JobStatus> st = client.JobStatus();
    if (st.ok() && done(*st)) return true;
    std::this_thread::yield();
  }
  return false;
}

inline std::vector<ServerProcess> StartServers(int n, const std::vector<std::string>& args = {}) {
  std::vector<ServerProcess> servers;
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<ServerProcess> s = ServerProcess::Start(args);
    EXPECT_THAT(s.status(), IsOk());
    if (s.ok()) servers.push_back(*std::move(s));
  }
  return servers;
}

inline std::vector<std::string> Addresses(const std::vector<ServerProcess>& servers) {
  std::vector<std::string> out;
  for (const ServerProcess& s : servers) out.push_back(s.address());
  return out;
}

// Opens one client per dp rank.
inline absl::StatusOr<std::vector<std::unique_ptr<Worker>>> OpenWorkers(
    const LeastSquares& p, DType dtype, const std::string& job, const std::string& config_json,
    const std::vector<std::string>& servers, ClientOptions base = {}) {
  std::vector<std::unique_ptr<Worker>> workers;
  for (int r = 0; r < p.dp; ++r) {
    ClientOptions o = base;
    o.job = job;
    o.servers = servers;
    o.dp_rank = r;
    o.dp_world_size = p.dp;
    if (o.call_timeout == ClientOptions{}.call_timeout) o.call_timeout = absl::Seconds(30);
    ZO_ASSIGN_OR_RETURN(std::unique_ptr<OffloadClient> c,
                        OffloadClient::Open(o, config_json, ManifestOf(p, dtype)));
    workers.push_back(std::make_unique<Worker>(p, r, dtype, std::move(c)));
  }
  return workers;
}

}  // namespace zo::testing

#endif  // ZO_TESTS_SERVER_TRAINING_HARNESS_H_
