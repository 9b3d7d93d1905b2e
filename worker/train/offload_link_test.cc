// OffloadLink against an embedded server on the CPU backend: with the
// weights of the next step pulled and uploaded into a second set of tensors
// while a step computes, every step must still compute on exactly the
// version the DPU policy names, and its gradients must reach the servers.
#include "worker/train/offload_link.h"

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/convert.h"
#include "common/dpu_policy.h"
#include "common/memory_estimate.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "server/offload_server.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/testing/forwarding_backend.h"
#include "worker/train/step_abort.h"

namespace zo::train {
namespace {

using ::zo::testing::IsOk;

struct Fixture {
  std::unique_ptr<OffloadServer> server;
  std::unique_ptr<backend::Backend> cpu = backend::MakeCpuBackend();
  std::vector<model::Param> params;
  std::vector<model::Param*> pointers;
  std::vector<TensorSpec> manifest;
};

// An embedded server with `server_options` (listening nowhere) and the
// params `shapes`, in layer order.
void StartServerWithParams(Fixture& f, ServerOptions server_options,
                           const std::vector<std::pair<std::string, backend::Shape>>& shapes,
                           DType dtype = DType::kBFloat16) {
  server_options.listen = "";
  auto server = OffloadServer::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  f.server = std::move(*server);
  for (const auto& [name, shape] : shapes) {
    model::Param p;
    p.name = name;
    p.shape = shape;
    p.init = model::ParamInit::Normal(0.5);
    p.value = f.cpu->Zeros(dtype, shape);
    p.grad = f.cpu->Zeros(DType::kFloat32, shape);
    f.params.push_back(std::move(p));
    f.manifest.push_back({name, shape, dtype});
  }
  for (model::Param& p : f.params) f.pointers.push_back(&p);
}

void StartServerAndParams(Fixture& f, DType dtype = DType::kBFloat16) {
  StartServerWithParams(f, ServerOptions{}, {{"a", {3, 5}}, {"b", {7}}}, dtype);
}

TEST(OffloadLinkTest, EveryStepComputesOnTheVersionTheDpuPolicyNames) {
  for (bool dpu : {false, true}) {
    SCOPED_TRACE(dpu ? "DPU" : "no DPU");
    Fixture f;
    ASSERT_NO_FATAL_FAILURE(StartServerAndParams(f));
    ClientOptions options;
    options.job = "link";
    options.channels = {f.server->InProcessChannel()};
    const std::string config = std::string(R"({"train_batch_size": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}, "bf16": {"enabled": true},
        "zo": {"dpu": {"enabled": )") +
                               (dpu ? "true" : "false") + R"(, "warmup_steps": 1}}})";
    auto client = OffloadClient::Open(options, config, f.manifest);
    ASSERT_TRUE(client.ok()) << client.status();
    OffloadLink link(client->get(), *f.cpu, f.manifest, DType::kBFloat16);
    ASSERT_THAT(link.InitializeIfFresh(f.pointers, 7), IsOk());
    const std::vector<int> all = {0, 1};
    std::vector<std::vector<std::byte>> seen;  // tensor a, per step
    for (int64_t step = 1; step <= 8; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      ASSERT_THAT(link.LoadWeights(step, f.pointers), IsOk());
      ASSERT_THAT(link.AwaitWeights(f.pointers), IsOk());
      // What the servers hold for the version this step computes on.
      const int64_t version = VersionForStep((*client)->config().zo.dpu, step);
      std::vector<std::byte> a(30), b(14);
      const std::vector<absl::Span<std::byte>> want = {absl::MakeSpan(a), absl::MakeSpan(b)};
      ASSERT_THAT((*client)->Pull(version, -1, all, want).status(), IsOk());
      for (size_t i = 0; i < f.params.size(); ++i) {
        std::vector<std::byte> got(want[i].size());
        ASSERT_THAT(f.cpu->Download(f.params[i].value, absl::MakeSpan(got)), IsOk());
        EXPECT_EQ(std::memcmp(got.data(), want[i].data(), got.size()), 0) << f.params[i].name;
      }
      seen.push_back(a);
      // Gradients that differ per step and element move the weights.
      for (model::Param& p : f.params) {
        std::vector<float> g(static_cast<size_t>(p.numel()));
        for (size_t j = 0; j < g.size(); ++j) g[j] = (j % 3 == 0 ? -1.0f : 1.0f) * (step + j);
        ASSERT_THAT(f.cpu->UploadFloat(g, p.grad), IsOk());
        ASSERT_THAT(link.PushGradient(step, p, -1), IsOk());
      }
      ASSERT_THAT(link.FinishStep(step), IsOk());
    }
    // The weights moved: the step computed last saw others than the first.
    EXPECT_NE(seen.front(), seen.back());
  }
}

// The CPU backend, except that once armed, the uploads after the first
// `pass` wait until Release: a device still copying the later layers.
class HeldUploadsBackend final : public backend::testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;

  void HoldAfter(int pass) {
    std::lock_guard<std::mutex> lock(mu_);
    pass_ = pass;
  }
  // Waits until `n` uploads are held (the prefetch queues them after its
  // pull, beside the step that LoadWeights already let go).
  void AwaitHeld(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    came_.wait(lock, [&] { return held_.size() >= n; });
  }
  // Runs the held uploads (or fails them with `status`) and stops holding.
  void Release(absl::Status status = absl::OkStatus()) {
    std::vector<Held> held;
    {
      std::lock_guard<std::mutex> lock(mu_);
      held.swap(held_);
      pass_ = -1;
    }
    for (Held& h : held) h.done(status.ok() ? inner_.Upload(h.src, h.dst) : status);
  }

  // What the link's prefetch uploads with.
  void UploadAsyncAfter(absl::Span<const std::byte> src, backend::Tensor& dst,
                        const std::shared_ptr<const void>& mark,
                        std::function<void(absl::Status)> done) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pass_ == 0) {
        held_.push_back({src, dst, std::move(done)});
        came_.notify_all();
        return;
      }
      if (pass_ > 0) --pass_;
    }
    inner_.UploadAsyncAfter(src, dst, mark, std::move(done));
  }

 private:
  struct Held {
    absl::Span<const std::byte> src;
    backend::Tensor dst;
    std::function<void(absl::Status)> done;
  };
  std::mutex mu_;
  std::condition_variable came_;
  int pass_ = -1;  // -1: not holding
  std::vector<Held> held_;
};

// Layer 0 starts early: the step boundary waits for the pull, not for the
// uploads, and each layer's weights are there when AwaitWeights says so,
// bit for bit the version; an upload that fails fails the step that awaits
// it, and the step's retry uploads the version whole.
TEST(OffloadLinkTest, TheFirstLayersComputeWhileLaterWeightsStillArrive) {
  Fixture f;
  ASSERT_NO_FATAL_FAILURE(StartServerAndParams(f));
  HeldUploadsBackend held(*f.cpu);
  ClientOptions options;
  options.job = "early";
  options.channels = {f.server->InProcessChannel()};
  options.routes = {f.server->DataRoute()};
  auto client = OffloadClient::Open(options, R"({"train_batch_size": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}, "bf16": {"enabled": true}})",
                                    f.manifest);
  ASSERT_TRUE(client.ok()) << client.status();
  OffloadLink link(client->get(), held, f.manifest, DType::kBFloat16);
  // A failed assertion must not leave the link's teardown waiting on a
  // held upload.
  absl::Cleanup release_on_failure = [&] { held.Release(); };
  ASSERT_THAT(link.InitializeIfFresh(f.pointers, 7), IsOk());
  const auto value = [&](int i) {
    std::vector<std::byte> got(static_cast<size_t>(f.params[i].value.nbytes()));
    EXPECT_THAT(f.cpu->Download(f.params[i].value, absl::MakeSpan(got)), IsOk());
    return got;
  };
  const auto version = [&](int64_t v, int i) {
    std::vector<std::byte> a(30), b(14);
    EXPECT_THAT((*client)->Pull(v, -1, {0, 1}, {absl::MakeSpan(a), absl::MakeSpan(b)}).status(),
                IsOk());
    return i == 0 ? a : b;
  };
  const auto push = [&](int64_t step) {
    for (model::Param& p : f.params) {
      std::vector<float> g(static_cast<size_t>(p.numel()));
      for (size_t j = 0; j < g.size(); ++j) g[j] = (j % 3 == 0 ? -1.0f : 1.0f) * (step + j);
      ASSERT_THAT(f.cpu->UploadFloat(g, p.grad), IsOk());
      ASSERT_THAT(link.PushGradient(step, p, -1), IsOk());
    }
    ASSERT_THAT(link.FinishStep(step), IsOk());
  };

  ASSERT_THAT(link.LoadWeights(1, f.pointers), IsOk());
  ASSERT_THAT(link.AwaitWeights(f.pointers), IsOk());
  held.HoldAfter(1);  // step 2's prefetch: a's upload goes, b's waits
  ASSERT_NO_FATAL_FAILURE(push(1));

  ASSERT_THAT(link.LoadWeights(2, f.pointers), IsOk());
  // LoadWeights returned, and b's upload cannot end before Release: the
  // step began before its last layer's weights were there.
  held.AwaitHeld(1);
  ASSERT_THAT(link.AwaitWeights(absl::MakeConstSpan(f.pointers).first(1)), IsOk());
  EXPECT_EQ(value(0), version(1, 0));
  held.Release();
  ASSERT_THAT(link.AwaitWeights(f.pointers), IsOk());
  EXPECT_EQ(value(0), version(1, 0));
  const std::vector<std::byte> b1 = version(1, 1);  // the servers keep only the newest
  EXPECT_EQ(value(1), b1);
  held.HoldAfter(1);
  ASSERT_NO_FATAL_FAILURE(push(2));

  ASSERT_THAT(link.LoadWeights(3, f.pointers), IsOk());
  held.AwaitHeld(1);
  held.Release(absl::DataLossError("the copy engine failed"));
  EXPECT_EQ(link.AwaitWeights(f.pointers), absl::DataLossError("the copy engine failed"));
  // The step again: the version is the same, its upload whole.
  ASSERT_THAT(link.LoadWeights(3, f.pointers), IsOk());
  ASSERT_THAT(link.AwaitWeights(f.pointers), IsOk());
  EXPECT_EQ(value(0), version(2, 0));
  EXPECT_EQ(value(1), version(2, 1));
  EXPECT_NE(version(2, 1), b1);
  ASSERT_NO_FATAL_FAILURE(push(3));
}

// On the in-process route the next step's weights are pulled in batches
// that the servers answer as soon as they wrote them: the step starts, and
// its first layers get their weights, while the servers still write the
// version (a kept speculation's commit, held here), and every layer
// computes on the version's exact bits.
TEST(OffloadLinkTest, TheNextStepStartsBeforeTheServersWroteItsWholeVersion) {
  Fixture f;
  std::mutex mu;
  std::condition_variable cv;
  int64_t speculated = 0;  // chunks of step 1
  bool committing = false, go_on = false;
  ServerOptions server_options;
  server_options.test_speculated = [&](int64_t step, int64_t chunks) {
    std::lock_guard lock(mu);
    if (step == 1) speculated = chunks;
    cv.notify_all();
  };
  server_options.test_committing = [&](int64_t step) {
    std::unique_lock lock(mu);
    if (step != 1) return;
    committing = true;
    cv.notify_all();
    cv.wait(lock, [&] { return go_on; });
  };
  // With chunks of 64 elements: a is chunks 0 and 1, b chunk 2.
  ASSERT_NO_FATAL_FAILURE(StartServerWithParams(f, server_options, {{"a", {8, 16}}, {"b", {64}}}));
  const auto release = [&] {
    std::lock_guard lock(mu);
    go_on = true;
    cv.notify_all();
  };
  absl::Cleanup release_on_failure = release;
  ClientOptions options;
  options.job = "written";
  options.channels = {f.server->InProcessChannel()};
  options.routes = {f.server->DataRoute()};
  auto client = OffloadClient::Open(options, R"({"train_batch_size": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}, "bf16": {"enabled": true},
      "gradient_clipping": 0, "zo": {"chunk_elems": 64}})",
                                    f.manifest);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_EQ((*client)->routes(), std::vector<std::string>{"in_process"});
  auto link = std::make_unique<OffloadLink>(client->get(), *f.cpu, f.manifest, DType::kBFloat16);
  ASSERT_THAT(link->InitializeIfFresh(f.pointers, 7), IsOk());
  ASSERT_THAT(link->LoadWeights(1, f.pointers), IsOk());
  ASSERT_THAT(link->AwaitWeights(f.pointers), IsOk());
  const auto push = [&](model::Param& p) {
    std::vector<float> g(static_cast<size_t>(p.numel()));
    for (size_t j = 0; j < g.size(); ++j) g[j] = (j % 3 == 0 ? -1.0f : 1.0f) * (1 + j % 5);
    ASSERT_THAT(f.cpu->UploadFloat(g, p.grad), IsOk());
    ASSERT_THAT(link->PushGradient(1, p, -1), IsOk());
  };
  // The backward: the last layer first; the servers speculate on it, so
  // the decided step is a kept speculation's commit.
  ASSERT_NO_FATAL_FAILURE(push(f.params[1]));
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return speculated >= 1; });
  }
  ASSERT_NO_FATAL_FAILURE(push(f.params[0]));
  ASSERT_THAT(link->FinishStep(1), IsOk());  // prefetches step 2
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return committing; });
  }
  // Step 2 while the commit is held. A LoadWeights that waited for the
  // whole version would not return before the release: the bound below,
  // not a sleep, says so.
  std::future<absl::Status> started = std::async(std::launch::async, [&] {
    ZO_RETURN_IF_ERROR(link->LoadWeights(2, f.pointers));
    return link->AwaitWeights(f.pointers);
  });
  if (started.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    release();
    FAIL() << "step 2 waited for the servers to write its whole version";
  }
  ASSERT_THAT(started.get(), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus during, (*client)->JobStatus());
  EXPECT_EQ(during.version(), 0) << "the version was whole before step 2 started";
  std::vector<std::vector<std::byte>> got;
  for (model::Param& p : f.params) {
    got.emplace_back(static_cast<size_t>(p.value.nbytes()));
    ASSERT_THAT(f.cpu->Download(p.value, absl::MakeSpan(got.back())), IsOk());
  }
  std::move(release_on_failure).Invoke();
  std::vector<std::byte> a(256), b(128);
  ASSERT_THAT((*client)->Pull(1, -1, {0, 1}, {absl::MakeSpan(a), absl::MakeSpan(b)}).status(),
              IsOk());
  EXPECT_EQ(got[0], a) << "layer 0 computes on other weights than version 1's";
  EXPECT_EQ(got[1], b) << "layer 1 computes on other weights than version 1's";
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus after, (*client)->JobStatus());
  EXPECT_GE(after.confirmed_chunks(), 1) << "the step was not a kept speculation";
}

// A client of job `job` with zo.dpu.compensation "worker" from step 3
// (one warm-up step), AdamW with decay; `precision` the config's 16-bit
// section.
absl::StatusOr<std::unique_ptr<OffloadClient>> OpenCompensated(Fixture& f, const std::string& job,
                                                               const std::string& precision) {
  ClientOptions options;
  options.job = job;
  options.channels = {f.server->InProcessChannel()};
  options.applies_dpu_compensation = true;
  const std::string config = absl::StrCat(
      R"({"train_batch_size": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.1}},
          "zo": {"dpu": {"enabled": true, "warmup_steps": 1, "compensation": "worker"}}, )",
      precision, "}");
  return OffloadClient::Open(options, config, f.manifest);
}

// The weights a compensated step computes on, as the link forms them
// (common/dpu_compensation.h): the version pulled moved by the servers'
// terms; a zero coefficient leaves its term out (`before` and `grad` may
// then be empty).
std::vector<float> Compensated(const WeightsCompensation& c, const std::vector<float>& last,
                               const std::vector<float>& before, const std::vector<float>& grad) {
  std::vector<float> want(last.size());
  for (size_t j = 0; j < want.size(); ++j) {
    float w = static_cast<float>(c.last) * last[j];
    if (c.before != 0) w = std::fma(static_cast<float>(c.before), before[j], w);
    if (c.grad != 0) w = std::fma(-static_cast<float>(c.grad), grad[j], w);
    want[j] = w;
  }
  return want;
}

// Param `i` holds `want` rounded to `dtype`, bit for bit.
void ExpectValue(Fixture& f, size_t i, DType dtype, const std::vector<float>& want) {
  std::vector<std::byte> want_bytes(want.size() * DTypeSize(dtype)), got(want_bytes.size());
  FloatToDType(want.data(), dtype, want_bytes.data(), want.size());
  ASSERT_THAT(f.cpu->Download(f.params[i].value, absl::MakeSpan(got)), IsOk());
  EXPECT_EQ(got, want_bytes) << f.params[i].name;
}

// zo.dpu.compensation "worker": a delayed step computes on the version it
// pulled moved by the servers' coefficients of the step before, with that
// step's gradients and the version before (common/dpu_compensation.h);
// the other steps on the version as pulled.
TEST(OffloadLinkTest, CompensatedStepsComputeOnTheLastTwoVersionsAndTheGradient) {
  Fixture f;
  ASSERT_NO_FATAL_FAILURE(StartServerAndParams(f));
  auto client = OpenCompensated(f, "compensated", R"("bf16": {"enabled": true})");
  ASSERT_TRUE(client.ok()) << client.status();
  OffloadLink link(client->get(), *f.cpu, f.manifest, DType::kBFloat16);
  link.CompensateDelayedSteps();
  ASSERT_THAT(link.InitializeIfFresh(f.pointers, 7), IsOk());
  const std::vector<int> all = {0, 1};
  std::map<int64_t, std::vector<std::vector<float>>> pulled;  // version -> per tensor
  std::vector<std::vector<float>> last_grads;
  int compensated = 0;
  for (int64_t step = 1; step <= 8; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    ASSERT_THAT(link.LoadWeights(step, f.pointers), IsOk());
    ASSERT_THAT(link.AwaitWeights(f.pointers), IsOk());
    const int64_t version = VersionForStep((*client)->config().zo.dpu, step);
    if (!pulled.contains(version)) {
      std::vector<std::byte> a(30), b(14);
      const std::vector<absl::Span<std::byte>> raw = {absl::MakeSpan(a), absl::MakeSpan(b)};
      ASSERT_THAT((*client)->Pull(version, -1, all, raw).status(), IsOk());
      for (const auto& r : raw) {
        std::vector<float> w(r.size() / 2);
        Bf16ToFloat(reinterpret_cast<const uint16_t*>(r.data()), w.data(), w.size());
        pulled[version].push_back(std::move(w));
      }
    }
    const bool delayed = version == step - 2;
    std::vector<WeightsCompensation> c(2);
    if (delayed) {
      const bool have_before = pulled.contains(version - 1);
      ZO_ASSERT_OK_AND_ASSIGN(c, (*client)->StepCompensation(step - 1, have_before));
      EXPECT_GT(c[0].grad, 0.0);
      compensated += c[0].before != 0 ? 1 : 0;
    }
    for (size_t i = 0; i < f.params.size(); ++i) {
      const std::vector<float>& last = pulled[version][i];
      const std::vector<float> want =
          Compensated(c[i], last, c[i].before != 0 ? pulled[version - 1][i] : std::vector<float>{},
                      c[i].grad != 0 ? last_grads[i] : std::vector<float>{});
      ASSERT_NO_FATAL_FAILURE(ExpectValue(f, i, DType::kBFloat16, want));
      if (delayed) {
        EXPECT_NE(want, last) << f.params[i].name << " moved";
      }
    }
    last_grads.clear();
    for (model::Param& p : f.params) {
      std::vector<float> g(static_cast<size_t>(p.numel()));
      for (size_t j = 0; j < g.size(); ++j) g[j] = (j % 3 == 0 ? -1.0f : 1.0f) * (step + j);
      ASSERT_THAT(f.cpu->UploadFloat(g, p.grad), IsOk());
      ASSERT_THAT(link.PushGradient(step, p, -1), IsOk());
      last_grads.push_back(std::move(g));
    }
    ASSERT_THAT(link.FinishStep(step), IsOk());
  }
  EXPECT_GE(compensated, 4) << "steps with the version before";
}

// The same around a skipped step (fp16, an inf in step 4's gradient): the
// step after it computes on the version before it as pulled (its terms
// leave the inf gradient out); the next takes the skipped version, whose
// data is unchanged, without the version before (the momentum of a skipped
// step is none); the one after that has both again. Each step's weights
// against the versions the test pulls itself and the servers' terms, and
// the link's notion of "changed" against the servers' own answer.
TEST(OffloadLinkTest, CompensatedStepsAroundASkippedStep) {
  Fixture f;
  ASSERT_NO_FATAL_FAILURE(StartServerAndParams(f, DType::kFloat16));
  auto client = OpenCompensated(f, "compensated-skip",
                                R"("fp16": {"enabled": true, "initial_scale_power": 4})");
  ASSERT_TRUE(client.ok()) << client.status();
  OffloadLink link(client->get(), *f.cpu, f.manifest, DType::kFloat16);
  link.CompensateDelayedSteps();
  ASSERT_THAT(link.InitializeIfFresh(f.pointers, 7), IsOk());
  constexpr int64_t kSkipped = 4;
  const std::vector<int> all = {0, 1};
  // The last two distinct versions pulled, as the link keeps them.
  std::vector<std::vector<float>> last, before;
  int64_t last_version = -1, before_version = -1;
  std::vector<std::vector<float>> last_grads;
  std::map<std::string, int> seen;  // which branches the steps took
  for (int64_t step = 1; step <= 8; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    ASSERT_THAT(link.LoadWeights(step, f.pointers), IsOk());
    ASSERT_THAT(link.AwaitWeights(f.pointers), IsOk());
    const int64_t version = VersionForStep((*client)->config().zo.dpu, step);
    if (version != last_version) {
      std::vector<std::byte> a(30), b(14);
      const std::vector<absl::Span<std::byte>> raw = {absl::MakeSpan(a), absl::MakeSpan(b)};
      ZO_ASSERT_OK_AND_ASSIGN(const bool changed, (*client)->Pull(version, -1, all, raw));
      ASSERT_TRUE(changed);
      std::vector<std::vector<float>> w;
      for (const auto& r : raw) {
        w.emplace_back(r.size() / 2);
        HalfToFloat(reinterpret_cast<const uint16_t*>(r.data()), w.back().data(), w.back().size());
      }
      // The servers' answer to "version over the last one": unchanged only
      // for the skipped step's version.
      std::vector<std::byte> a2(30), b2(14);
      ZO_ASSERT_OK_AND_ASSIGN(
          const bool differs,
          (*client)->Pull(version, last_version, all, {absl::MakeSpan(a2), absl::MakeSpan(b2)}));
      EXPECT_EQ(differs, version != kSkipped || last_version < 0) << "version " << version;
      if (differs) {
        before = std::move(last);
        before_version = last_version;
      }
      last = std::move(w);
      last_version = version;
    }
    const bool delayed = version == step - 2;
    std::vector<WeightsCompensation> c(2);
    if (delayed) {
      const bool have_before = before_version == version - 1;
      ZO_ASSERT_OK_AND_ASSIGN(c, (*client)->StepCompensation(step - 1, have_before));
      if (step - 1 == kSkipped) {
        EXPECT_EQ(c[0].last, 1.0);
        EXPECT_EQ(c[0].grad, 0.0);
        ++seen["after the skip"];
      }
      if (version == kSkipped) {
        EXPECT_EQ(c[0].before, 0.0) << "a skipped step brings no momentum";
        EXPECT_GT(c[0].grad, 0.0);
        ++seen["on the skipped version"];
      }
      if (c[0].before != 0) ++seen["with the version before"];
    }
    for (size_t i = 0; i < f.params.size(); ++i) {
      ASSERT_NO_FATAL_FAILURE(ExpectValue(
          f, i, DType::kFloat16,
          Compensated(c[i], last[i], c[i].before != 0 ? before[i] : std::vector<float>{},
                      c[i].grad != 0 ? last_grads[i] : std::vector<float>{})));
    }
    last_grads.clear();
    for (model::Param& p : f.params) {
      std::vector<float> g(static_cast<size_t>(p.numel()));
      for (size_t j = 0; j < g.size(); ++j) g[j] = (j % 3 == 0 ? -1.0f : 1.0f) * (step + j);
      if (step == kSkipped) g[1] = std::numeric_limits<float>::infinity();
      ASSERT_THAT(f.cpu->UploadFloat(g, p.grad), IsOk());
      ASSERT_THAT(link.PushGradient(step, p, -1), IsOk());
      last_grads.push_back(std::move(g));
    }
    ASSERT_THAT(link.FinishStep(step), IsOk());
  }
  EXPECT_EQ(seen["after the skip"], 1);
  EXPECT_EQ(seen["on the skipped version"], 1);
  EXPECT_GE(seen["with the version before"], 2);
}

// Streaming: each step's host bytes are the version the DPU policy names,
// and the link says they are unchanged exactly when that version is the
// step before's (DPU's first steps), so the window keeps its layers then.
// Over a gRPC channel the link keeps a host copy; over the in-process route
// it keeps none and reads what the window asks for from the servers, into
// the slot asked for.
TEST(OffloadLinkTest, HostWeightsSayWhenTheyAreTheStepBeforesVersion) {
  for (const bool route : {false, true}) {
    SCOPED_TRACE(route ? "in-process route" : "gRPC");
    Fixture f;
    ASSERT_NO_FATAL_FAILURE(StartServerAndParams(f));
    ClientOptions options;
    options.job = "host";
    options.channels = {f.server->InProcessChannel()};
    if (route) options.routes = {f.server->DataRoute()};
    auto client = OffloadClient::Open(options, R"({"train_batch_size": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}, "bf16": {"enabled": true},
        "zo": {"dpu": {"enabled": true, "warmup_steps": 2}, "gradient_accumulation": "servers"}})",
                                      f.manifest);
    ASSERT_TRUE(client.ok()) << client.status();
    OffloadLink link(client->get(), *f.cpu, f.manifest, DType::kBFloat16);
    ASSERT_THAT(link.InitializeIfFresh(f.pointers, 7), IsOk());
    int64_t last_version = -1;
    int unchanged = 0;
    for (int64_t step = 1; step <= 6; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      absl::StatusOr<model::HostWeights> host = link.LoadHostWeights(step, f.pointers);
      ASSERT_TRUE(host.ok()) << host.status();
      EXPECT_EQ(link.streamed_kind(),
                route ? StreamedWeights::Kind::kServers : StreamedWeights::Kind::kHostCopy);
      const int64_t version = VersionForStep((*client)->config().zo.dpu, step);
      EXPECT_EQ(host->changed, version != last_version);
      unchanged += host->changed ? 0 : 1;
      last_version = version;
      std::vector<std::byte> a(30), b(14);
      const std::vector<absl::Span<std::byte>> want = {absl::MakeSpan(a), absl::MakeSpan(b)};
      ASSERT_THAT((*client)->Pull(version, -1, {0, 1}, want).status(), IsOk());
      std::vector<absl::Span<const std::byte>> got = {host->bytes.begin(), host->bytes.end()};
      if (route) {
        EXPECT_TRUE(host->bytes.empty());  // no copy kept here
        ASSERT_NE(host->read, nullptr);
        const std::vector<const model::Param*> both = {&f.params[0], &f.params[1]};
        ZO_ASSERT_OK_AND_ASSIGN(got, host->read(both, static_cast<int>(step % 2)));
        // One at a time, b alone into the other slot.
        ZO_ASSERT_OK_AND_ASSIGN(const std::vector<absl::Span<const std::byte>> only_b,
                                host->read({&f.params[1]}, static_cast<int>((step + 1) % 2)));
        ASSERT_EQ(only_b.size(), 1u);
        ASSERT_EQ(only_b[0].size(), b.size());
        EXPECT_EQ(std::memcmp(only_b[0].data(), b.data(), b.size()), 0);
      }
      ASSERT_EQ(got.size(), 2u);
      for (size_t i = 0; i < 2; ++i) {
        ASSERT_EQ(got[i].size(), want[i].size());
        EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), want[i].size()), 0) << i;
      }
      for (model::Param& p : f.params) {
        std::vector<float> g(static_cast<size_t>(p.numel()), static_cast<float>(step));
        ASSERT_THAT(f.cpu->UploadFloat(g, p.grad), IsOk());
        ASSERT_THAT(link.PushGradient(step, p, 0), IsOk());
      }
      ASSERT_THAT(link.FinishStep(step), IsOk());
    }
    EXPECT_GT(unchanged, 0);  // the policy did repeat a version
    // What it holds, against zo-ctl estimate's streamed column (which
    // counts a host copy): 44 bytes of weights and a gradient ring as large
    // as both gradients, each rounded to 64 bytes in the ring (the
    // estimate counts 44 bytes there).
    ZO_ASSERT_OK_AND_ASSIGN(const MemoryEstimate e, EstimateMemory({.tensor_elems = {15, 7},
                                                                    .precision = DType::kBFloat16,
                                                                    .max_live_params = 22}));
    EXPECT_EQ(e.gpu_streamed.host_staging_bytes, 44 + 44);
    if (route) {
      // No copy: the ring, the smallest tensor (b), and two read slots that
      // grew to both tensors.
      EXPECT_EQ(link.host_bytes(), 128 + 14 + 2 * 44);
    } else {
      EXPECT_EQ(link.host_bytes(), e.gpu_streamed.host_staging_bytes - 44 + 128);
    }
  }
}

// zo.gradient_accumulation "servers": four micro-batches each push their own
// gradients through two staging slots (micro-batch 2 reuses 0's places once
// they are on the wire) and the server sums them. Values and sums are small
// integers, exact in bf16, so the job trains bit for bit as one that was
// pushed the sum once ("device").
TEST(OffloadLinkTest, MicroBatchPushesThroughTwoSlotsSumOnTheServer) {
  Fixture f;
  ASSERT_NO_FATAL_FAILURE(StartServerAndParams(f));
  const auto config = [](const char* policy) {
    return absl::StrCat(R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}, "bf16": {"enabled": true},
        "zo": {"gradient_accumulation": ")",
                        policy, R"("}})");
  };
  std::vector<std::unique_ptr<OffloadClient>> clients;
  std::vector<std::unique_ptr<OffloadLink>> links;
  for (const char* policy : {"servers", "device"}) {
    ClientOptions options;
    options.job = std::string("link-") + policy;
    options.channels = {f.server->InProcessChannel()};
    auto client = OffloadClient::Open(options, config(policy), f.manifest);
    ASSERT_TRUE(client.ok()) << client.status();
    clients.push_back(*std::move(client));
    links.push_back(
        std::make_unique<OffloadLink>(clients.back().get(), *f.cpu, f.manifest, DType::kBFloat16));
    ASSERT_THAT(links.back()->InitializeIfFresh(f.pointers, 7), IsOk());
  }
  const auto upload = [&](model::Param& p, float factor) {
    std::vector<float> g(static_cast<size_t>(p.numel()));
    for (size_t j = 0; j < g.size(); ++j) g[j] = (j % 3 == 0 ? -factor : factor) * (1 + j % 4);
    return f.cpu->UploadFloat(g, p.grad);
  };
  for (int64_t step = 1; step <= 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    for (auto& link : links) ASSERT_THAT(link->LoadWeights(step, f.pointers), IsOk());
    for (model::Param& p : f.params) {
      for (int micro = 0; micro < 4; ++micro) {
        ASSERT_THAT(upload(p, static_cast<float>(micro + 1)), IsOk());
        ASSERT_THAT(links[0]->PushGradient(step, p, micro), IsOk());
      }
      ASSERT_THAT(upload(p, 1 + 2 + 3 + 4), IsOk());
      ASSERT_THAT(links[1]->PushGradient(step, p, -1), IsOk());
    }
    for (auto& link : links) ASSERT_THAT(link->FinishStep(step), IsOk());
    std::vector<std::vector<std::byte>> weights;
    for (auto& client : clients) {
      std::vector<std::byte> a(30), b(14);
      ASSERT_THAT(client->Pull(step, -1, {0, 1}, {absl::MakeSpan(a), absl::MakeSpan(b)}).status(),
                  IsOk());
      a.insert(a.end(), b.begin(), b.end());
      weights.push_back(a);
    }
    EXPECT_EQ(weights[0], weights[1]);
  }
  // A micro-batch the job does not have is refused before anything is sent.
  auto bytes = std::make_shared<std::vector<std::byte>>(30);
  const absl::Status refused = clients[1]->PushShared(4, 0, bytes, *bytes, 1);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("micro-batch 1 is outside [0, 1)"), std::string::npos)
      << refused;
}

// Rank 0 of a two-rank job whose calls wait an hour: a pull that waits for
// rank 1 hangs the test unless something ends it.
absl::StatusOr<std::unique_ptr<OffloadClient>> OpenRankZeroOfTwo(Fixture& f,
                                                                 const std::string& job) {
  ClientOptions options;
  options.job = job;
  options.channels = {f.server->InProcessChannel()};
  options.dp_world_size = 2;
  options.call_timeout = absl::Hours(1);
  const std::string config = R"({"train_batch_size": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}, "bf16": {"enabled": true}})";
  return OffloadClient::Open(options, config, f.manifest);
}

// Two dp ranks; rank 1 pushes nothing for step 1. Rank 0's link prefetches
// step 2's weights (version 1), which only rank 1's gradients would make.
// Retrying step 1 and tearing the link down must give that prefetch up
// rather than wait for the call's deadline (an hour here: a hang would be
// this test's failure), which in a worker stuck both ranks' pipelines.
TEST(OffloadLinkTest, APrefetchThatCannotCompleteIsGivenUp) {
  Fixture f;
  ASSERT_NO_FATAL_FAILURE(StartServerAndParams(f));
  auto client = OpenRankZeroOfTwo(f, "stuck");
  ASSERT_TRUE(client.ok()) << client.status();
  auto link = std::make_unique<OffloadLink>(client->get(), *f.cpu, f.manifest, DType::kBFloat16);
  ASSERT_THAT(link->InitializeIfFresh(f.pointers, 7), IsOk());
  ASSERT_THAT(link->LoadWeights(1, f.pointers), IsOk());
  for (model::Param& p : f.params) ASSERT_THAT(link->PushGradient(1, p, -1), IsOk());
  ASSERT_THAT(link->FinishStep(1), IsOk());  // starts the prefetch of step 2
  // The step again (as after a failure elsewhere): its version 0 is there.
  ASSERT_THAT(link->LoadWeights(1, f.pointers), IsOk());
  ASSERT_THAT(link->AwaitWeights(f.pointers), IsOk());
  std::vector<std::byte> a(30);
  ASSERT_THAT(f.cpu->Download(f.params[0].value, absl::MakeSpan(a)), IsOk());
  std::vector<std::byte> want(30), b(14);
  ASSERT_THAT((*client)->Pull(0, -1, {0, 1}, {absl::MakeSpan(want), absl::MakeSpan(b)}).status(),
              IsOk());
  EXPECT_EQ(a, want);
  // LoadWeights started the prefetch of step 2 again; torn down while it waits.
  link.reset();
}

// A stage process whose neighbour died: the pull of its next weights that
// is not a prefetch (stage 0 of 1F1B pushes last, so its next step's
// weights are mostly pulled when the step starts) waits for a version the
// servers cannot reach without the dead stage. The StepAbort the transport
// trips must end it, as it ends a prefetch, instead of the call's deadline
// (an hour here; it used to stall the chaos soak's stage processes).
TEST(OffloadLinkTest, AnAbortedStepEndsAPullThatIsNotAPrefetch) {
  Fixture f;
  ASSERT_NO_FATAL_FAILURE(StartServerAndParams(f));
  auto client = OpenRankZeroOfTwo(f, "aborted");
  ASSERT_TRUE(client.ok()) << client.status();
  OffloadLink link(client->get(), *f.cpu, f.manifest, DType::kBFloat16);
  auto abort = std::make_shared<StepAbort>();
  link.set_step_abort(abort);
  ASSERT_THAT(link.InitializeIfFresh(f.pointers, 7), IsOk());
  ASSERT_THAT(link.LoadWeights(1, f.pointers), IsOk());
  for (model::Param& p : f.params) ASSERT_THAT(link.PushGradient(1, p, -1), IsOk());
  ASSERT_THAT(link.FinishStep(1), IsOk());  // prefetches step 2, which rank 1 never makes
  abort->Trip(absl::UnavailableError("pipeline stage 1 is gone"));
  // Step 3 is not the prefetched step: its weights are pulled at once.
  EXPECT_EQ(link.LoadWeights(3, f.pointers), absl::UnavailableError("pipeline stage 1 is gone"));
}

}  // namespace
}  // namespace zo::train
