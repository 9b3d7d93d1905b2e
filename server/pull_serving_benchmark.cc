// What serving weights costs a server, for each way ParamVersions holds them
// (server/param_versions.h):
//   - a pull: every piece of one version from a stored copy (the slice
//     points at it; the baseline), rounding the fp32 master into a piece
//     buffer as it is given, and undoing the last step from the state (the
//     version before the latest, with DPU) (bytes/s: the 16-bit bytes
//     served);
//   - an update: the fused Adam step writing the new 16-bit copy (stored
//     versions), without it (served from the master), and checking the
//     undo against each tile's old weights near rounding boundaries (served
//     from the master, DPU).
//
//   build/release/bin/pull_serving_benchmark --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/dtype.h"
#include "offload/adam_undo.h"
#include "offload/optimizer_kernels.h"
#include "offload/thread_pool.h"
#include "offload/tier/tiered_state.h"
#include "server/job_internal.h"
#include "server/param_versions.h"
#include "server/pull_cursor.h"

namespace zo {
namespace {

constexpr int64_t kElems = int64_t{64} << 20;  // 128 MiB of fp16 per pull

const std::vector<float>& Master() {
  static const std::vector<float>* master = [] {
    auto* m = new std::vector<float>(kElems);
    for (int64_t i = 0; i < kElems; ++i) (*m)[i] = static_cast<float>(i % 4093) * 0.001f;
    return m;
  }();
  return *master;
}

ParamVersions::FromMaster FromMasterOptions() {
  return {.round_master =
              [](int64_t offset, int64_t n, void* out) {
                job_internal::RoundMaster(Master().data() + offset, out, static_cast<size_t>(n),
                                          DType::kFloat16);
              },
          .keep_previous = false};
}

// Takes every piece of version 0 and touches its first byte, as the
// transport would start reading it.
void ServeAll(benchmark::State& state, ParamVersions& versions) {
  int64_t sink = 0;
  for (auto _ : state) {
    PullCursor cursor = PullCursor::Serving(
        0, 1.0, DType::kFloat16, *versions.Acquire(0),
        {{.tensor = 0, .tensor_offset = 0, .local_offset = 0, .elems = kElems}});
    PullPiece piece;
    while (cursor.Next(&piece)) sink += static_cast<int64_t>(piece.data[0]);
  }
  benchmark::DoNotOptimize(sink);
  state.SetBytesProcessed(state.iterations() * kElems * 2);
}

void BM_PullFromStoredCopy(benchmark::State& state) {
  auto versions = *ParamVersions::Create(kElems, DType::kFloat16);
  job_internal::RoundMaster(Master().data(), versions->base_data(), kElems, DType::kFloat16);
  ServeAll(state, *versions);
}
BENCHMARK(BM_PullFromStoredCopy)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_PullRoundingTheMaster(benchmark::State& state) {
  auto versions = *ParamVersions::CreateFromMaster(kElems, DType::kFloat16, FromMasterOptions());
  ServeAll(state, *versions);
}
BENCHMARK(BM_PullRoundingTheMaster)->Unit(benchmark::kMillisecond)->UseRealTime();

// A RAM-resident state after `steps` real steps (fp16 gradients), served
// from its master with the previous version undone.
struct SteppedState {
  ThreadPool pool;
  std::unique_ptr<TieredOptimizerState> tier;
  std::unique_ptr<ParamVersions> versions;
  std::vector<uint16_t> grad = std::vector<uint16_t>(kElems);
  int64_t version = 0;

  explicit SteppedState(bool keep_previous = true) {
    tier = *TieredOptimizerState::Create({}, kElems, &pool);
    if (!tier->LoadMaster(0, Master()).ok()) std::abort();
    for (int64_t i = 0; i < kElems; ++i) grad[i] = static_cast<uint16_t>(0x1000 + i % 4093);
    versions = *ParamVersions::CreateFromMaster(kElems, DType::kFloat16,
                                                {.round_master =
                                                     [this](int64_t offset, int64_t n, void* out) {
                                                       job_internal::RoundMaster(
                                                           tier->ram_master() + offset, out,
                                                           static_cast<size_t>(n), DType::kFloat16);
                                                     },
                                                 .keep_previous = keep_previous});
  }
  // One step serving only the latest version (no DPU).
  absl::Status StepLatestOnly() {
    const AdamStepConstants c = MakeAdamStepConstants({}, version + 1, 1.0);
    versions->BeginWrite();
    const absl::Status s =
        tier->AdamStep(c, {grad.data(), DType::kFloat16}, {nullptr, DType::kFloat16});
    versions->CommitWrite(++version);
    return s;
  }
  // One step serving the version it replaces too (DPU), as the job does.
  absl::Status Step() {
    const AdamStepConstants c = MakeAdamStepConstants({}, version + 1, 1.0);
    versions->BeginWrite([this, c](int64_t offset, int64_t n, void* out) {
      RoundWeightsBeforeAdamStep(c, tier->ram_master() + offset, tier->ram_m() + offset,
                                 tier->ram_v() + offset, {out, DType::kFloat16},
                                 static_cast<size_t>(n));
    });
    // As the job does: fp32 old weights, checked near rounding boundaries.
    const auto check = [&](const TieredOptimizerState::UpdatedTile& t) {
      std::vector<uint32_t> index;
      std::vector<uint8_t> values;
      FindUndoMismatches(c, static_cast<const float*>(t.old_weights), t.p, t.m, t.v,
                         DType::kFloat16, static_cast<size_t>(t.n), &index, &values);
      versions->MarkKept(t.offset, t.n, std::move(index), std::move(values));
    };
    const absl::Status s =
        tier->AdamStep(c, {grad.data(), DType::kFloat16}, {nullptr, DType::kFloat16}, nullptr,
                       nullptr, check, DType::kFloat32);
    versions->CommitWrite(++version);
    return s;
  }
};

void BM_PullUndoingTheStep(benchmark::State& state) {
  SteppedState s;
  for (int i = 0; i < 3; ++i) {
    if (!s.Step().ok()) state.SkipWithError("AdamStep failed");
  }
  state.counters["corrected_per_million"] =
      1e6 * static_cast<double>(s.versions->corrections().elems) / kElems;
  int64_t sink = 0;
  for (auto _ : state) {
    PullCursor cursor = PullCursor::Serving(
        s.version - 1, 1.0, DType::kFloat16, *s.versions->Acquire(s.version - 1),
        {{.tensor = 0, .tensor_offset = 0, .local_offset = 0, .elems = kElems}});
    PullPiece piece;
    while (cursor.Next(&piece)) sink += static_cast<int64_t>(piece.data[0]);
  }
  benchmark::DoNotOptimize(sink);
  state.SetBytesProcessed(state.iterations() * kElems * 2);
}
BENCHMARK(BM_PullUndoingTheStep)->Unit(benchmark::kMillisecond)->UseRealTime();

// One server update of kElems RAM-resident elements (fp16 gradients) on all
// cores, on the same state. state.range(0): 0 writes the new 16-bit copy in
// the kernel (stored versions), 1 writes none (served from the master, no
// DPU), 2 checks the undo against each tile's old weights near rounding
// boundaries and keeps only corrections (DPU, as the job does).
void BM_Update(benchmark::State& state) {
  const int mode = static_cast<int>(state.range(0));
  SteppedState s(/*keep_previous=*/mode == 2);
  std::unique_ptr<ParamVersions> stored;
  if (mode == 0) stored = *ParamVersions::Create(kElems, DType::kFloat16);
  const auto step = [&]() -> absl::Status {
    switch (mode) {
      case 0: {
        const AdamStepConstants c = MakeAdamStepConstants({}, s.version + 1, 1.0);
        void* out = stored->BeginWrite();
        const absl::Status st =
            s.tier->AdamStep(c, {s.grad.data(), DType::kFloat16}, {out, DType::kFloat16});
        stored->CommitWrite(++s.version);
        return st;
      }
      case 1:
        return s.StepLatestOnly();
      default:
        return s.Step();
    }
  };
  // The first steps' pages and corrections settle before timing.
  for (int i = 0; i < 2; ++i) {
    if (!step().ok()) state.SkipWithError("AdamStep failed");
  }
  for (auto _ : state) {
    if (!step().ok()) state.SkipWithError("AdamStep failed");
  }
  state.counters["kept_bytes_per_elem"] =
      static_cast<double>(mode == 0 ? stored->buffer_bytes() : s.versions->buffer_bytes()) / kElems;
  state.SetItemsProcessed(state.iterations() * kElems);
}
BENCHMARK(BM_Update)
    ->ArgName("stored0_master1_dpu2")
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace zo

BENCHMARK_MAIN();
