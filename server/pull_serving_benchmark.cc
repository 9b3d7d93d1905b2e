// What serving weights costs a server, for each way ParamVersions holds them
// (server/param_versions.h):
//   - a pull: every piece of one version from a stored copy (the slice
//     points at it; the baseline) against rounding the fp32 master into a
//     piece buffer as it is given (bytes/s: the 16-bit bytes served);
//   - an update: the fused Adam step writing the new 16-bit copy (stored
//     versions), without it (served from the master), writing the previous
//     version's copy instead (served from the master, DPU), and keeping
//     that version in a pass of its own first (how DPU kept it before).
//
//   build/release/bin/pull_serving_benchmark --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
#include <cstdint>
#include <cstring>
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

ParamVersions::FromMaster FromMasterOptions() {
  return {.round_master =
              [](int64_t offset, int64_t n, void* out) {
                job_internal::RoundMaster(Master().data() + offset, out, static_cast<size_t>(n),
                                          DType::kFloat16);
              },
          .keep_previous = true};
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

// Keeping the previous version in a pass of its own, on all cores: what
// DPU's update added before the kernel wrote the kept version itself.
void KeepInOnePass(ThreadPool& pool, ParamVersions& versions, const float* master, void* kept) {
  pool.RunOnAll([&](int worker) {
    const int64_t begin = kElems * worker / pool.size();
    const int64_t end = kElems * (worker + 1) / pool.size();
    job_internal::RoundMaster(master + begin, static_cast<uint16_t*>(kept) + begin,
                              static_cast<size_t>(end - begin), DType::kFloat16);
    versions.MarkKept(begin, end - begin);
  });
}

void BM_KeepPreviousVersion(benchmark::State& state) {
  ThreadPool pool;
  auto versions = *ParamVersions::CreateFromMaster(kElems, DType::kFloat16, FromMasterOptions());
  int64_t version = 1;
  for (auto _ : state) {
    void* kept = versions->BeginWrite();
    KeepInOnePass(pool, *versions, Master().data(), kept);
    versions->CommitWrite(version++);
  }
  state.SetBytesProcessed(state.iterations() * kElems * 2);
}
BENCHMARK(BM_KeepPreviousVersion)->Unit(benchmark::kMillisecond)->UseRealTime();

// One server update of kElems RAM-resident elements (fp16 gradients) on all
// cores. state.range(0): 0 writes the new 16-bit copy in the kernel (stored
// versions), 1 writes none (from the master), 2 writes the old version's
// copy into the kept buffer in the kernel (from the master, DPU, as the job
// does), 3 keeps it in a pass of its own first, then updates writing none.
void BM_Update(benchmark::State& state) {
  ThreadPool pool;
  auto tier = *TieredOptimizerState::Create({}, kElems, &pool);
  if (!tier->LoadMaster(0, Master()).ok()) state.SkipWithError("LoadMaster failed");
  std::vector<uint16_t> grad(kElems, 0x1400);  // fp16 2^-10
  const int mode = static_cast<int>(state.range(0));
  // Stored versions (materialized), or served from the master.
  auto versions =
      mode == 0 ? *ParamVersions::Create(kElems, DType::kFloat16)
                : *ParamVersions::CreateFromMaster(kElems, DType::kFloat16, FromMasterOptions());
  const AdamStepConstants c = MakeAdamStepConstants(AdamHyperParams{}, 1, 1.0);
  TieredOptimizerState::TileUpdated mark_kept;
  if (mode == 2) mark_kept = [&](int64_t offset, int64_t n) { versions->MarkKept(offset, n); };
  // The buffers' pages are touched before timing, as a job's are after its
  // first steps.
  for (int64_t version = 1; version <= 2; ++version) {
    if (void* out = versions->BeginWrite(); out != nullptr) std::memset(out, 0, kElems * 2);
    if (mode != 0) versions->MarkKept(0, kElems);
    versions->CommitWrite(version);
  }
  int64_t version = 3;
  for (auto _ : state) {
    void* out = mode == 1 ? nullptr : versions->BeginWrite();
    if (mode == 3) {
      KeepInOnePass(pool, *versions, tier->ram_master(), out);
      out = nullptr;
    }
    const absl::Status s =
        tier->AdamStep(c, {grad.data(), DType::kFloat16}, {out, DType::kFloat16}, nullptr, nullptr,
                       mark_kept, mode == 2 ? CopyOf::kOldWeight : CopyOf::kNewWeight);
    if (!s.ok()) state.SkipWithError("AdamStep failed");
    if (mode != 1) versions->CommitWrite(version++);
  }
  state.SetItemsProcessed(state.iterations() * kElems);
}
BENCHMARK(BM_Update)
    ->ArgName("stored0_master1_fused2_separate3")
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Arg(3)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace zo

BENCHMARK_MAIN();
