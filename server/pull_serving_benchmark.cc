// What serving weights costs a server, for each way ParamVersions holds them
// (server/param_versions.h):
//   - a pull: every piece of one version from a stored copy (the slice
//     points at it; the baseline) against rounding the fp32 master into a
//     piece buffer as it is given (bytes/s: the 16-bit bytes served);
//   - an update: the fused Adam step writing the new 16-bit copy (stored
//     versions), without it (served from the master), and without it after
//     rounding the master into the kept buffer (served from the master, DPU).
//
//   build/release/bin/pull_serving_benchmark --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
#include <cstdint>
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/dtype.h"
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

ParamVersions::FromMaster FromMasterOptions(ThreadPool* pool) {
  return {.round_master =
              [](int64_t offset, int64_t n, void* out) {
                job_internal::RoundMaster(Master().data() + offset, out, static_cast<size_t>(n),
                                          DType::kFloat16);
              },
          .keep_previous = true,
          .pool = pool};
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
  auto versions =
      *ParamVersions::CreateFromMaster(kElems, DType::kFloat16, FromMasterOptions(nullptr));
  ServeAll(state, *versions);
}
BENCHMARK(BM_PullRoundingTheMaster)->Unit(benchmark::kMillisecond)->UseRealTime();

// The rounding into the kept buffer at the start of each DPU update, on all
// cores (the update's pool).
void BM_KeepPreviousVersion(benchmark::State& state) {
  ThreadPool pool;
  auto versions =
      *ParamVersions::CreateFromMaster(kElems, DType::kFloat16, FromMasterOptions(&pool));
  int64_t version = 1;
  for (auto _ : state) {
    versions->BeginWrite();
    versions->CommitWrite(version++);
  }
  state.SetBytesProcessed(state.iterations() * kElems * 2);
}
BENCHMARK(BM_KeepPreviousVersion)->Unit(benchmark::kMillisecond)->UseRealTime();

// One server update of kElems RAM-resident elements (fp16 gradients) on all
// cores. state.range(0): 0 writes the 16-bit copy in the kernel (stored
// versions), 1 writes none (from the master), 2 keeps the previous version
// first and writes none (from the master, DPU).
void BM_Update(benchmark::State& state) {
  ThreadPool pool;
  auto tier = *TieredOptimizerState::Create({}, kElems, &pool);
  if (!tier->LoadMaster(0, Master()).ok()) state.SkipWithError("LoadMaster failed");
  std::vector<uint16_t> grad(kElems, 0x1400);  // fp16 2^-10
  std::vector<uint16_t> copy(kElems);
  ParamVersions::FromMaster from = FromMasterOptions(&pool);
  from.round_master = [&](int64_t offset, int64_t n, void* out) {
    job_internal::RoundMaster(tier->ram_master() + offset, out, static_cast<size_t>(n),
                              DType::kFloat16);
  };
  auto kept = *ParamVersions::CreateFromMaster(kElems, DType::kFloat16, from);
  const AdamStepConstants c = MakeAdamStepConstants(AdamHyperParams{}, 1, 1.0);
  const int mode = static_cast<int>(state.range(0));
  int64_t version = 1;
  for (auto _ : state) {
    if (mode == 2) kept->BeginWrite();
    const absl::Status s = tier->AdamStep(c, {grad.data(), DType::kFloat16},
                                          {mode == 0 ? copy.data() : nullptr, DType::kFloat16});
    if (!s.ok()) state.SkipWithError("AdamStep failed");
    if (mode == 2) kept->CommitWrite(version++);
  }
  state.SetItemsProcessed(state.iterations() * kElems);
}
BENCHMARK(BM_Update)
    ->ArgName("stored0_master1_kept2")
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace zo

BENCHMARK_MAIN();
