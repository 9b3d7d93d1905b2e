// Job's step (server/job.h): the step thread's loop, which between steps
// runs a due checkpoint, and otherwise reports the step's gradient
// statistics, takes the lead's decision and applies it (the fused Adam over
// this server's chunks, writing the served version and the pulls that
// registered), then makes the new version the job's.
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/convert.h"
#include "common/dpu_policy.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/stream_copy.h"
#include "common/units.h"
#include "offload/adam_undo.h"
#include "offload/optimizer_kernels.h"
#include "rpc/proto_convert.h"
#include "server/group_hyper.h"
#include "server/job.h"
#include "server/state_checkpoint.h"

namespace zo {

v1::StepStats Job::ComputeStepStats(int64_t step, int64_t generation) {
  v1::StepStats stats;
  stats.set_job(spec_.name);
  stats.set_step(step);
  stats.set_server_index(spec_.server_index);
  stats.set_generation(generation);
  if (chunks().empty()) return stats;
  // Chunks speculated on had theirs taken then.
  const bool speculated = speculation_.step == step && speculation_.generation == generation;
  const StepGradStats s = speculated ? accum_->Stats(speculation_.stats) : accum_->Stats();
  for (size_t i = 0; i < chunks().size(); ++i) {
    stats.add_chunks(chunks()[i].id);
    stats.add_chunk_sum_squares(s.per_chunk[i].sum_squares);
  }
  stats.set_non_finite(s.total.non_finite);
  return stats;
}

void Job::StepLoop() {
  const JobPosition::WorkTests tests = StepWorkTests();
  for (;;) {
    const JobPosition::Work work = position_.AwaitWork(tests);
    switch (work.kind) {
      case JobPosition::Work::Kind::kStop:
        return;
      case JobPosition::Work::Kind::kCheckpoint:
        checkpoints_.Run(work.version, work.generation, work.health);
        break;
      case JobPosition::Work::Kind::kStep:
        RunStep(work);
        break;
      case JobPosition::Work::Kind::kSpeculate:
        Speculate(work);
        break;
    }
  }
}

JobPosition::WorkTests Job::StepWorkTests() {
  return {
      .checkpoint_due =
          [this](int64_t version, bool healthy) {
            return is_lead() && checkpoints_.Due(version, healthy);
          },
      .step_ready = [this] { return accum_->Ready() && !checkpoints_.frozen(); },
      .speculation_ready =
          [this] {
            return no_speculation_.empty() && accum_->has_filled() && !checkpoints_.frozen();
          },
      // While the lead waits for gradients, it checks every few seconds
      // that its followers still have the job: one that restarted empty
      // leaves the workers unable to push, and nothing else would tell.
      .idle =
          [this] {
            if (is_lead() && spec_.servers.size() >= 2 && !checkpoints_.frozen()) {
              recovery_.Probe();
            }
          },
  };
}

void Job::RunStep(const JobPosition::Work& work) {
  // Between steps every chunk takes gradients for the open step.
  const int64_t step = work.version + 1;
  const int64_t generation = work.generation;
  // The scale the step's gradients carry: with DPU, that of the older
  // version the workers computed on.
  const double scale_used =
      position_.ScaleFor(VersionForStep(spec_.config.zo.dpu, step, work.oldest_version));

  const absl::Time ready = absl::Now();
  v1::StepStats stats;
  {
    JobStateLock::ForStep hold(state_lock_);
    stats = ComputeStepStats(step, generation);
  }
  const std::optional<v1::StepCommit> decided =
      is_lead() ? coordinator_->LeadRound(stats, scale_used) : coordinator_->FollowerRound(stats);
  if (!decided.has_value() || !position_.BeginApplying(generation)) return;
  const v1::StepCommit& commit = *decided;
  if (compensation_ != nullptr) {
    // A worker adds its own rank's gradient, which stands for the mean of
    // the ranks' that the step sums: the multiplier of one rank's is dp
    // times the step's.
    const StepInputs inputs = InputsOf(commit);
    compensation_->Decided(step, commit.skip(), inputs.grad_multiplier * spec_.dp_world_size,
                           inputs.applied_steps, GroupLrOf(inputs));
  }

  const absl::Time update_start = absl::Now();
  absl::Status applied;
  const int64_t speculated = SpeculatedChunks(step, generation);
  const bool kept = speculated > 0 && SpeculationHolds(commit);
  if (resources_.applying) resources_.applying(step);
  {
    JobStateLock::ForStep hold(state_lock_);
    if (!position_.AtGeneration(generation)) {
      // A restore took the state after the step was decided and replaced
      // it: the step belongs to the generation the restore undid, and
      // updating the restored state with it would train on what the
      // restore dropped (EndUpdate makes no version of it).
      applied = absl::AbortedError(
          absl::StrCat("job ", spec_.name, ": step ", step, " was undone by a restore"));
    } else if (kept) {
      applied = ApplySpeculated(commit);
    } else {
      state_->DiscardSpeculation();
      applied = Apply(commit);
    }
  }
  speculation_ = {};
  if (compensation_ != nullptr) compensation_->UpdateEnded(step, applied.ok(), commit.skip());
  last_step_clipped_ =
      !commit.skip() &&
      commit.grad_multiplier() != UnclippedGradMultiplier(spec_.dp_world_size, scale_used);
  const absl::Time update_end = absl::Now();
  if (speculated > 0) {
    counters_.AddDecided(speculated, kept, kept ? absl::ZeroDuration() : update_end - update_start);
  }
  const JobPosition::UpdateEndHooks hooks{
      // The pulls the update wrote are answered once the version is the
      // job's (a status asked after them shows it), or told it is not.
      .fills_end =
          [&](bool made) {
            if (fills_ != nullptr) fills_->EndUpdate(step, made);
          },
      .advanced = [&](int64_t s) { coordinator_->Advance(s); },
  };
  const std::optional<absl::Duration> wait = position_.EndUpdate({.commit = &commit,
                                                                  .generation = generation,
                                                                  .applied = applied,
                                                                  .ready = ready,
                                                                  .update_end = update_end},
                                                                 hooks);
  if (!wait.has_value()) return;
  counters_.AddStep(commit.skip(), *wait, update_end - update_start);
  LogStep(commit, *wait, update_end - update_start, speculated, kept);
}

std::vector<double> Job::GroupLrOf(const StepInputs& inputs) const {
  if (!inputs.group_lr.empty()) return inputs.group_lr;
  return std::vector<double>(static_cast<size_t>(groups_->num_groups()), inputs.lr);
}

RangedConstants<AdamStepConstants> Job::ConstantsOf(const StepInputs& inputs) const {
  return groups_->StepConstants(GroupLrOf(inputs), inputs.group_hyper, inputs.applied_steps,
                                inputs.grad_multiplier);
}

RangedConstants<AdamStepConstants> Job::RestoredStepConstants(const CheckpointMeta& meta) const {
  // The gradient's scale does not enter the undo.
  std::vector<double> lr = meta.last_group_lr;
  if (static_cast<int>(lr.size()) != groups_->num_groups()) {
    lr.assign(static_cast<size_t>(groups_->num_groups()), LastStepOf(meta, spec_.config).lr);
  }
  std::vector<ParamGroupConfig> hyper = meta.last_group_hyper;
  if (static_cast<int>(hyper.size()) != groups_->num_groups()) hyper.clear();
  return groups_->StepConstants(lr, hyper, meta.applied_steps, 1.0);
}

void Job::FillPulls(const TieredOptimizerState::UpdatedTile& t) const {
  // The tile's new master is in this worker's cache: round it from there.
  // An fp32 copy bypasses the cache: the puller's buffer is not read here
  // again, and a plain store would first read each of its lines from memory
  // (64 Mi elements, 2 cores: the step was 1.73-1.88 x the Adam alone with
  // plain stores, 1.39-1.42 x with these; zo-bench offload --routes
  // in_process --dtype fp32).
  fills_->Fill(t.offset, t.n, [&](int64_t from, int64_t n, std::byte* dst) {
    const float* master = t.p + (from - t.offset);
    if (spec_.dtype == DType::kFloat32) {
      StreamCopy(master, dst, static_cast<size_t>(n) * sizeof(float));
    } else {
      FloatToDType(master, spec_.dtype, dst, static_cast<size_t>(n));
    }
  });
}

ParamVersions::Undo Job::UndoOf(const RangedConstants<AdamStepConstants>& c) const {
  return [this, c](int64_t offset, int64_t n, void* out) {
    c.ForEach(offset, offset + n, [&](int64_t b, int64_t e, const AdamStepConstants& k) {
      RoundWeightsBeforeAdamStep(
          k, state_->ram_master() + b, state_->ram_m() + b, state_->ram_v() + b,
          OffsetBy(TypedPtr{out, spec_.dtype}, static_cast<size_t>(b - offset)),
          static_cast<size_t>(e - b));
    });
  };
}

absl::Status Job::Apply(const v1::StepCommit& commit) {
  size_t released = 0;
  if (commit.skip()) {
    versions_->RecordSkip(commit.step());
  } else {
    const RangedConstants<AdamStepConstants> c = ConstantsOf(InputsOf(commit));
    own_part_->BeforeUpdateLocked();
    // Materialized versions: the kernel writes the new version's copy. From
    // the master, pulls of the new version (in-process) follow the update
    // tile by tile; with DPU the kernel also writes each tile's old weights
    // into a scratch, where the undo of this step is checked against them
    // (only near rounding boundaries), and pulls of the version being
    // replaced follow tile by tile too.
    const bool keeps = versions_->from_master() && versions_->keep_previous();
    void* lp = versions_->BeginWrite(keeps ? UndoOf(c) : nullptr);
    if (versions_->from_master()) {
      // Pulls on the in-process route may read the new version as its
      // ranges are done; they get its loss scale now, and its waiters wake.
      position_.BeginWriting(commit.step(), commit.next_loss_scale(),
                             [&] { fills_->BeginUpdate(commit.step()); });
    }
    TieredOptimizerState::TileUpdated tile_done;
    if (keeps) {
      tile_done = [&](const TieredOptimizerState::UpdatedTile& t) {
        std::vector<uint32_t> index;
        std::vector<uint8_t> values;
        c.ForEach(t.offset, t.offset + t.n, [&](int64_t b, int64_t e, const AdamStepConstants& k) {
          const auto i = static_cast<size_t>(b - t.offset);  // into the tile
          const size_t found = index.size();
          FindUndoMismatches(k, static_cast<const float*>(t.old_weights) + i, t.p + i, t.m + i,
                             t.v + i, spec_.dtype, static_cast<size_t>(e - b), &index, &values);
          for (size_t j = found; j < index.size(); ++j) index[j] += static_cast<uint32_t>(i);
        });
        versions_->MarkKept(t.offset, t.n, std::move(index), std::move(values));
        FillPulls(t);
      };
    } else if (versions_->from_master()) {
      tile_done = [&](const TieredOptimizerState::UpdatedTile& t) {
        versions_->MarkDone(t.offset, t.n);
        FillPulls(t);
      };
    }
    // A checkpoint part in progress takes each tile as it was before this
    // step. Pulls of the version this step replaces read the tiles it has
    // not reached from the master (a DPU worker's pull does not wait for
    // the update); the update claims each tile before writing it.
    StateObserver before_tile = own_part_->ObserverLocked();
    if (keeps) {
      before_tile = [this, observer = std::move(before_tile)](
                        int64_t offset, int64_t n, const float* p, const float* m, const float* v) {
        versions_->ClaimRange(offset, n);
        if (observer) observer(offset, n, p, m, v);
      };
    }
    if (compensation_ != nullptr) {
      // v's sums per tensor part: what the workers' next compensation divides by.
      tile_done = [this, then = std::move(tile_done)](const TieredOptimizerState::UpdatedTile& t) {
        compensation_->AddTile(t.offset, t.n, t.v);
        if (then) then(t);
      };
    }
    const absl::Status stepped = state_->AdamStep(
        c, accum_->gradients(), {lp, spec_.dtype},
        [&](int64_t end) { released = accum_->ReleaseBelow(released, end, commit.step()); },
        before_tile, tile_done, keeps ? std::optional<DType>(DType::kFloat32) : std::nullopt);
    if (!stepped.ok()) {
      versions_->AbortWrite();
      own_part_->DropLocked(stepped);
    }
    ZO_RETURN_IF_ERROR(stepped);
    versions_->CommitWrite(commit.step());
  }
  accum_->Release(released, chunks().size(), commit.step());
  return absl::OkStatus();
}

void Job::LogStep(const v1::StepCommit& commit, absl::Duration wait, absl::Duration update,
                  int64_t speculated, bool kept) {
  const int every = resources_.log_every > 0 ? resources_.log_every : spec_.config.steps_per_print;
  const absl::Duration serve = counters_.TakeRecentServe();
  if (commit.step() % every != 0 && !commit.skip()) return;
  const std::string speculation =
      speculated == 0
          ? ""
          : absl::StrFormat(" | speculated %d of %d chunks: %s", speculated, chunks().size(),
                            kept            ? "kept"
                            : commit.skip() ? "dropped (skipped)"
                                            : "updated again");
  // With DPU from the master: what serving the previous version costs.
  std::string previous;
  if (versions_->from_master() && versions_->keep_previous()) {
    const ParamVersions::CorrectionStats c = versions_->corrections();
    previous = absl::StrFormat(" | previous version: %d corrections (%s)", c.elems,
                               FormatBytes(static_cast<double>(c.bytes)));
  }
  ZO_LOG(INFO) << absl::StrFormat(
      "job %s step %d: loss_scale %g grad_norm %.4g lr %.3g%s | wait %.1f ms update %.1f ms "
      "serve %.1f ms%s%s",
      spec_.name, commit.step(), commit.next_loss_scale(), commit.grad_norm(), commit.lr(),
      !commit.skip()             ? ""
      : commit.failure().empty() ? " SKIPPED (overflow)"
                                 : " SKIPPED",
      absl::ToDoubleMilliseconds(wait), absl::ToDoubleMilliseconds(update),
      absl::ToDoubleMilliseconds(serve), previous, speculation);
}

// ---------------------------------------------------------------- coordination

absl::Status Job::OnStepStats(const v1::StepStats& stats) {
  return coordinator_->OnStepStats(stats);
}

absl::Status Job::OnCommit(const v1::StepCommit& commit) { return coordinator_->OnCommit(commit); }

absl::Status Job::OnStepLr(const v1::StepLrRequest& request) {
  ZO_RETURN_IF_ERROR(CheckIncarnation(request.incarnation()));
  std::vector<ParamGroupConfig> hyper;
  hyper.reserve(static_cast<size_t>(request.group_hyper_size()));
  for (const v1::GroupHyper& g : request.group_hyper()) hyper.push_back(GroupHyperOf(g));
  return coordinator_->OnStepLr(request.step(), request.dp_rank(), request.group_lr(), hyper);
}

absl::StatusOr<v1::StepCompensation> Job::StepCompensation(int64_t step, absl::Time deadline) {
  if (compensation_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", spec_.name, " has no zo.dpu.compensation: no step compensation to give"));
  }
  if (step < 1) return absl::InvalidArgumentError(absl::StrCat("step ", step, ": must be >= 1"));
  ZO_ASSIGN_OR_RETURN(const std::vector<CompensationTerms> terms,
                      compensation_->Await(step, deadline));
  v1::StepCompensation out;
  out.set_step(step);
  for (const CompensationTerms& t : terms) CompensationTermsToProto(t, out.add_tensors());
  return out;
}

}  // namespace zo
