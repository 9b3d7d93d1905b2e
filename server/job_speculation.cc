// Job's speculative update (server/job.h; zo.speculative_update): each chunk
// is updated as soon as its gradients are all in, with the constants the
// step has if it is applied unclipped, into the optimizer state's second
// bank (TieredOptimizerState::SpeculateAdam). The decision then keeps it
// (ApplySpeculated) or drops it, and the step is updated as without
// speculation (Apply). Either way the state, and every version served, is
// bit for bit what the update without speculation makes, because the bank
// is kept only when the decision's inputs equal the guess's, and equal
// inputs give the kernel equal constants.
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dpu_policy.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/stream_copy.h"
#include "common/units.h"
#include "offload/tier/swap_layout.h"
#include "server/job.h"
#include "server/job_internal.h"

namespace zo {

using job_internal::kStateBytesPerElem;

// Tiles a worker speculates beside the pushes before it looks again
// whether they are all in: 16 tiles, 256 Ki elements, about 0.3 ms.
constexpr int64_t kSpeculationSliceTiles = 16;

std::string Job::WhyNoSpeculation(std::optional<int64_t> spare) const {
  const Config& config = spec_.config;
  if (!config.zo.speculative_update) return "zo.speculative_update is false";
  if (config.zo.dpu.enabled) {
    return "the delayed parameter update (zo.dpu) overlaps the update with the next step already";
  }
  if (state_->nvme_sub_groups() > 0) {
    return "the optimizer state lies partly on NVMe, where there is no room beside it for the "
           "update";
  }
  const int64_t bank = local_elems_ * kStateBytesPerElem;
  if (resources_.ram_budget_bytes >= 0 && 2 * bank > resources_.ram_budget_bytes) {
    return absl::StrCat("the server's memory budget (", FormatBytes(resources_.ram_budget_bytes),
                        ") holds the optimizer state (", FormatBytes(bank),
                        ") but not a second copy of it");
  }
  if (spare.has_value() && *spare < bank) {
    return absl::StrCat("a second copy of the optimizer state takes ", FormatBytes(bank),
                        " and the host has ", FormatBytes(*spare), " to spare");
  }
  return "";
}

void Job::SetUpSpeculation(std::optional<int64_t> spare) {
  no_speculation_ = WhyNoSpeculation(spare);
  if (no_speculation_.empty()) {
    if (absl::Status reserved = state_->ReserveSpeculation(); !reserved.ok()) {
      no_speculation_ = std::string(reserved.message());
    }
  }
  if (no_speculation_.empty()) {
    ZO_LOG(INFO) << "job " << spec_.name
                 << ": speculative update: each chunk is updated as soon as its gradients are in, "
                    "before the step is decided (a second copy of the optimizer state, "
                 << FormatBytes(local_elems_ * kStateBytesPerElem) << ")";
  } else {
    ZO_LOG(INFO) << "job " << spec_.name << ": no speculative update: " << no_speculation_;
  }
}

void Job::Speculate(const JobPosition::Work& work) {
  const int64_t step = work.version + 1;
  if (speculation_.step != step || speculation_.generation != work.generation) {
    speculation_ = {.step = step,
                    .generation = work.generation,
                    .guess = std::nullopt,
                    .waiting = {},
                    .chunks = 0,
                    .stats = std::vector<std::optional<GradStats>>(chunks().size()),
                    .in_bank = std::vector<bool>(chunks().size())};
  }
  const std::vector<int> filled = accum_->TakeFilled();
  // While clipping is on, a speculation would only be updated again.
  if (last_step_clipped_) return;
  speculation_.waiting.insert(speculation_.waiting.end(), filled.begin(), filled.end());
  if (!speculation_.guess.has_value()) {
    const double scale_used =
        position_.ScaleFor(VersionForStep(spec_.config.zo.dpu, step, work.oldest_version));
    speculation_.guess = coordinator_->GuessUnclipped(scale_used);
    // Not yet (the lead waits for a client's rates): these chunks try
    // again when the next one fills, or the commit updates them.
    if (!speculation_.guess.has_value()) return;
  }
  const RangedConstants<AdamStepConstants> c = ConstantsOf(*speculation_.guess);
  // Pushes read where they lie (the in-process and same-host routes) take
  // none of the server's cores; those it copies or sums (gRPC, summed
  // ranks or micro-batches) keep one until every gradient is in. On the
  // in-process route, 2 cores, 32 Mi bf16 parameters, a compute as long as
  // the step: 48 ms a step with every worker speculating against 52-54 ms
  // on one (zo-bench offload --routes in_process --compute-ms auto).
  const bool all_workers = !accum_->CopiedPushes(step) || accum_->Ready();
  // Their statistics now, while the workers compute, rather than on the
  // step's path.
  const std::vector<GradStats> stats = accum_->ChunkStats(speculation_.waiting, all_workers);
  for (size_t i = 0; i < stats.size(); ++i) {
    speculation_.stats[static_cast<size_t>(speculation_.waiting[i])] = stats[i];
  }
  int64_t done = 0;
  const bool lone = spec_.servers.size() == 1;
  for (const int index : speculation_.waiting) {
    // Every gradient is in and this server alone decides (at once): the
    // step goes on to its decision, whose update takes the chunks left in
    // layer order (ApplySpeculated), rather than in the order the backward
    // filled them, last layers first. With other servers the decision's
    // round trip overlaps what is left here.
    if (lone && accum_->Ready()) break;
    // A plain hold, chunk by chunk: unlike the step's update this runs while
    // the workers still compute, when a checkpoint part's background capture
    // should not have to stand back (JobStateLock).
    std::lock_guard hold(state_lock_.mutex());
    // The bank may hold chunks of a step a restore dropped, and pulls
    // their weights.
    if (speculation_.chunks + done == 0) {
      state_->DiscardSpeculation();
      if (fills_ != nullptr) fills_->ForgetAhead();
    }
    // Once every gradient is in, no push needs a core any more.
    const absl::Status s =
        SpeculateChunk(index, c, step, /*all_workers=*/all_workers || accum_->Ready());
    if (!s.ok()) {
      // The state needs a restore, which the step's own update reports.
      ZO_LOG(WARNING) << "job " << spec_.name << ": speculative update of step " << step
                      << " stopped: " << s;
      break;
    }
    ++done;
  }
  speculation_.chunks += done;
  speculation_.waiting.clear();
  counters_.AddSpeculated(done);
  if (resources_.speculated) resources_.speculated(step, speculation_.chunks);
}

absl::Status Job::SpeculateChunk(int index, const RangedConstants<AdamStepConstants>& c,
                                 int64_t step, bool all_workers) {
  // In-process pulls of the step's version registered by now get each
  // tile's weights while it is in cache (PullFills::FillAhead), so that
  // once the step is decided little is left to copy.
  TieredOptimizerState::TileRounded fill_ahead;
  if (fills_ != nullptr) {
    fill_ahead = [this, step](const TieredOptimizerState::RoundedTile& t) {
      const auto elem = static_cast<int64_t>(DTypeSize(spec_.dtype));
      fills_->FillAhead(step, t.offset, t.n, [&](int64_t from, int64_t n, std::byte* dst) {
        const auto* src = static_cast<const std::byte*>(t.weights) + (from - t.offset) * elem;
        // The puller's buffer is not read here again: the copy bypasses
        // the cache (as FillPulls' fp32 one), for 16-bit tiles too.
        StreamCopy(src, dst, static_cast<size_t>(n * elem));
      });
    };
  }
  const LocalChunk& chunk = chunks()[static_cast<size_t>(index)];
  const std::optional<DType> rounded =
      fills_ != nullptr ? std::optional<DType>(spec_.dtype) : std::nullopt;
  // Beside the pushes, one worker takes the chunk a slice at a time; once
  // every gradient is in, no push needs a core any more, and the rest of
  // the chunk goes on every worker at once rather than on one to its end
  // (a chunk begun during zo.torch's pushes ran up to 5 ms past the last
  // one on a single worker while the other core idled; 32 Mi bf16).
  const int64_t end = chunk.local_offset + chunk.elems;
  for (int64_t at = chunk.local_offset; at < end;) {
    const bool all = all_workers || accum_->Ready();
    // Slices end on the tile grid (SpeculateAdam's streaming stores).
    const int64_t slice_end =
        all ? end : std::min(end, (at / kTileElems + kSpeculationSliceTiles) * kTileElems);
    ZO_RETURN_IF_ERROR(state_->SpeculateAdam(c, accum_->gradients(), at, slice_end - at, rounded,
                                             fill_ahead, all));
    at = slice_end;
  }
  speculation_.in_bank[static_cast<size_t>(index)] = true;
  return absl::OkStatus();
}

int64_t Job::SpeculatedChunks(int64_t step, int64_t generation) const {
  const bool ours = speculation_.step == step && speculation_.generation == generation &&
                    speculation_.guess.has_value();
  return ours ? speculation_.chunks : 0;
}

bool Job::SpeculationHolds(const v1::StepCommit& commit) const {
  return !commit.skip() && speculation_.guess.has_value() &&
         *speculation_.guess == InputsOf(commit);
}

absl::Status Job::ApplySpeculated(const v1::StepCommit& commit) {
  own_part_->BeforeUpdateLocked();
  // No DPU and the state all in RAM (WhyNoSpeculation): the versions are
  // served from the master and the previous one is not kept. The version
  // begins before the chunks left are updated: what the speculation wrote
  // into pulls registered by now is decided, and a pull whose ranges are
  // all written is answered while the rest of the version is not.
  versions_->BeginWrite();
  position_.BeginWriting(commit.step(), commit.next_loss_scale(),
                         [&] { fills_->BeginUpdate(commit.step(), /*ahead_holds=*/true); });
  // A chunk in the bank is done with its gradients (the commit reads
  // none): it takes the next step's pushes at once, which the worker,
  // answered range by range, may send while the last chunks are written
  // (held until the update's end, they were copied rather than read where
  // they lay, and the next step speculated on one core).
  for (size_t i = 0; i < chunks().size(); ++i) {
    if (speculation_.in_bank[i]) accum_->Release(i, i + 1, commit.step());
  }
  // The chunks not in the bank yet go there as the speculated ones did,
  // first layers first (the next forward needs them first): pulls
  // registered by now take their weights from the tiles in cache, where
  // the commit would round them from the master in memory once more. With
  // Speculate's chunks on every worker once the gradients are in: 2 cores,
  // 32 Mi bf16 parameters, the step (push, update, pull) 46 ms before, 37
  // after, medians of 6 runs alternating; zo-bench offload --routes
  // in_process.
  const RangedConstants<AdamStepConstants> c = ConstantsOf(InputsOf(commit));
  for (size_t i = 0; i < chunks().size(); ++i) {
    if (speculation_.in_bank[i]) continue;
    if (absl::Status s =
            SpeculateChunk(static_cast<int>(i), c, commit.step(), /*all_workers=*/true);
        !s.ok()) {
      versions_->AbortWrite();
      own_part_->DropLocked(s);
      return s;
    }
    accum_->Release(i, i + 1, commit.step());
  }
  if (resources_.committing) resources_.committing(commit.step());
  // The checkpoint part in progress takes each tile as it was; pulls of
  // the new version read it once the bank is the state (those registered
  // before a chunk was speculated have its weights already).
  const absl::Status committed =
      state_->CommitSpeculation(c, accum_->gradients(), own_part_->ObserverLocked(),
                                [&](const TieredOptimizerState::UpdatedTile& t) {
                                  versions_->MarkDone(t.offset, t.n);
                                  FillPulls(t);
                                });
  if (!committed.ok()) {
    versions_->AbortWrite();
    own_part_->DropLocked(committed);
    return committed;
  }
  versions_->CommitWrite(commit.step());
  return absl::OkStatus();
}

}  // namespace zo
