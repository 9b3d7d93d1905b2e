// Job's checkpoint and restore (server/job.h): the lead runs a checkpoint
// between steps and commits it once every server has written its part; a
// restore loads every server's chunks from any committed checkpoint,
// whatever server count wrote it.
#include <algorithm>
#include <filesystem>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/dpu_policy.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "offload/checkpoint/checkpoint_dir.h"
#include "offload/checkpoint/checkpoint_part.h"
#include "server/job.h"
#include "server/job_internal.h"
#include "server/state_checkpoint.h"

namespace zo {
absl::StatusOr<v1::CheckpointResponse> Job::Checkpoint(int64_t min_version, absl::Time deadline,
                                                       bool freeze) {
  if (!is_lead()) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoints are run by the lead server (",
                                                      spec_.servers[0], "), this is server ",
                                                      spec_.server_index));
  }
  return checkpoints_.Request(min_version, deadline, freeze);
}

void Job::Thaw() {
  if (!checkpoints_.Thaw()) return;
  ZO_LOG(INFO) << "job " << spec_.name << ": thawed at version " << position_.version();
}

LeadCheckpoints::Options Job::CheckpointOptionsForThis() const {
  return {.job = spec_.name,
          .servers = spec_.servers,
          .peers = resources_.peers,
          .peer_timeout = resources_.peer_timeout,
          .root = resources_.checkpoint_root,
          .keep = resources_.keep_checkpoints};
}

CheckpointActions Job::CheckpointActionsForThis() {
  return {
      .describe = [this](int64_t version,
                         CheckpointMeta& meta) { return DescribeCheckpoint(version, meta); },
      .begin_own_part =
          [this](int64_t version, const std::string& dir, uint32_t previous_bytes) {
            return BeginOwnPart(version, dir, previous_bytes);
          },
      .finish_own_part = [this](int64_t version,
                                const std::string& dir) { return FinishOwnPart(version, dir); },
      .drop_own_part =
          [this](const absl::Status& why) {
            std::lock_guard state_lock(state_lock_.mutex());
            own_part_->DropLocked(why);
          },
      .wake = [this] { position_.Notify(); },
      .heard = [this](int server, const absl::Status& answer) { recovery_.Heard(server, answer); },
  };
}

uint32_t Job::DescribeCheckpoint(int64_t version, CheckpointMeta& meta) const {
  meta.job = spec_.name;
  meta.manifest = spec_.manifest;
  meta.chunk_elems = map_.chunk_elems();
  meta.num_servers = static_cast<int>(spec_.servers.size());
  meta.dp_world_size = spec_.dp_world_size;
  meta.config_json = spec_.config_json;
  meta.init_fingerprint = spec_.init_fingerprint;
  meta.applied_steps = coordinator_->applied_steps();
  const LossScalerState s = coordinator_->scaler_state();
  meta.loss_scale = s.scale;
  meta.scaler_iteration = s.iteration;
  meta.scaler_last_overflow_iteration = s.last_overflow_iteration;
  meta.scaler_hysteresis_left = s.hysteresis_left;
  const int64_t oldest_version = position_.DescribeSteps(meta);
  return PlanPrevious(version, oldest_version, meta);
}

uint32_t Job::PlanPrevious(int64_t version, int64_t oldest_version, CheckpointMeta& meta) const {
  // Only when the step after `version` computes on the version before it.
  const DpuConfig& dpu = spec_.config.zo.dpu;
  if (!versions_->keep_previous() ||
      VersionForStep(dpu, version + 1, oldest_version) != version - 1) {
    return 0;
  }
  meta.has_previous = true;
  meta.previous_version = version - 1;
  meta.previous_loss_scale = position_.ScaleFor(version - 1);
  meta.previous_dtype = std::string(DTypeName(spec_.dtype));
  meta.previous_same_data = versions_->DataVersion(version - 1) == versions_->DataVersion(version);
  return meta.previous_same_data ? 0 : static_cast<uint32_t>(DTypeSize(spec_.dtype));
}

absl::StatusOr<v1::WriteCheckpointPartResponse> Job::WriteCheckpointPart(
    const v1::WriteCheckpointPartRequest& request, absl::Time deadline) {
  const auto phase = request.phase();
  // FINISH comes after steps went on; only BEGIN (and WHOLE) meet the
  // version itself.
  ZO_RETURN_IF_ERROR(position_.AwaitCheckpointVersion(
      request.generation(),
      phase == v1::WriteCheckpointPartRequest::FINISH ? std::nullopt
                                                      : std::optional<int64_t>(request.version()),
      deadline));
  if (phase != v1::WriteCheckpointPartRequest::FINISH) {
    ZO_RETURN_IF_ERROR(BeginOwnPart(request.version(), request.dir(), request.previous_bytes()));
  }
  if (phase == v1::WriteCheckpointPartRequest::BEGIN) return v1::WriteCheckpointPartResponse();
  return FinishOwnPart(request.version(), request.dir());
}

absl::Status Job::BeginOwnPart(int64_t version, const std::string& dir, uint32_t previous_bytes) {
  std::lock_guard state_lock(state_lock_.mutex());
  ZO_RETURN_IF_ERROR(position_.CheckAt(version));
  return own_part_->BeginLocked(version, dir, previous_bytes, *versions_);
}

absl::StatusOr<v1::WriteCheckpointPartResponse> Job::FinishOwnPart(int64_t version,
                                                                   const std::string& dir) {
  // NVMe: as long as the next step may take to carry it.
  const absl::Duration nvme_wait =
      std::clamp(2 * position_.step_interval(), absl::Seconds(1), absl::Seconds(60));
  return own_part_->Finish(version, dir, nvme_wait);
}

absl::StatusOr<v1::RestoreResponse> Job::Restore(const std::string& path, absl::Time deadline,
                                                 bool rollback,
                                                 std::optional<int64_t> if_restores) {
  (void)deadline;
  if (!is_lead()) {
    return absl::FailedPreconditionError(absl::StrCat("restores are run by the lead server (",
                                                      spec_.servers[0], "), this is server ",
                                                      spec_.server_index));
  }
  return restore_.Run(path, rollback, if_restores);
}

LeadRestore::Options Job::RestoreOptionsForThis() const {
  return {.spec = &spec_,
          .peers = resources_.peers,
          .peer_timeout = resources_.peer_timeout,
          .root = resources_.checkpoint_root};
}

RestoreActions Job::RestoreActionsForThis() {
  return {
      .position =
          [this] {
            const JobPosition::Restorable r = position_.restorable();
            return RestorePosition{.restores_done = r.restores_done,
                                   .version = r.version,
                                   .base_version = r.oldest_version,
                                   .generation = r.generation};
          },
      .restore_own_part =
          [this](const v1::RestorePartRequest& request) {
            return RestorePart(request, /*healthy_after=*/false);
          },
      .restore_decider =
          [this](const CheckpointMeta& meta) {
            return coordinator_->RestoreDecider(
                meta.applied_steps, {.scale = meta.loss_scale,
                                     .iteration = meta.scaler_iteration,
                                     .last_overflow_iteration = meta.scaler_last_overflow_iteration,
                                     .hysteresis_left = meta.scaler_hysteresis_left});
          },
      .ended = [this](const absl::Status& status,
                      const std::string& dir) { position_.LeadRestoreEnded(status, dir); },
  };
}

absl::Status Job::RestorePart(const v1::RestorePartRequest& request, bool healthy_after) {
  ZO_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(request.path()));
  const CheckpointMeta& meta = reader->meta();
  if (!SameManifest(meta.manifest, spec_.manifest)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", request.path(), " holds a different manifest than job ", spec_.name));
  }
  std::lock_guard state_lock(state_lock_.mutex());
  own_part_->DropLocked(
      absl::AbortedError(absl::StrCat("job ", spec_.name, " was restored to version ", meta.version,
                                      " while its part was written")));
  // A checkpoint waiting for a version the restore undoes would wait for
  // steps its own caller has to redo first (a worker blocked in it pushes
  // nothing): it fails now, and the caller asks again later. (One asked
  // from here on finds the job restoring, and fails with that.)
  checkpoints_.FailWaiting([&](int64_t min_version) {
    return absl::AbortedError(absl::StrCat("job ", spec_.name, " was restored to version ",
                                           meta.version, " while this checkpoint (of version ",
                                           min_version, " or later) waited; ask again"));
  });
  position_.BeginRestore(request.generation());
  // A rollback makes a new instance: calls from clients that opened the job
  // before it belong to steps it undoes, and are told where the job is now.
  if (request.rollback()) incarnation_ = job_internal::NewIncarnation();
  // Aborts the step in progress and drops what the old generation sent.
  coordinator_->Restart(request.generation(), meta.version + 1);
  // Aborts the pushes that wait and forgets what was delivered.
  accum_->Reset(meta.version + 1);
  // The version the next step computes on, if the checkpoint kept it and
  // this job runs a delayed parameter update too.
  ParamVersions::Previous previous = ParamVersions::Previous::kNone;
  if (meta.has_previous && spec_.config.zo.dpu.enabled && versions_->keep_previous() &&
      VersionForStep(spec_.config.zo.dpu, meta.version + 1, meta.version - 1) == meta.version - 1) {
    if (meta.previous_same_data) {
      previous = ParamVersions::Previous::kSameData;
    } else if (meta.previous_dtype == DTypeName(spec_.dtype)) {
      previous = ParamVersions::Previous::kStored;
    }
  }
  if (meta.has_previous && previous == ParamVersions::Previous::kNone) {
    ZO_LOG(WARNING) << "job " << spec_.name << ": checkpoint " << request.path()
                    << " kept the weights of version " << meta.previous_version << " ("
                    << meta.previous_dtype << ") for a delayed parameter update this job "
                    << "does not run the same way; resuming on version " << meta.version;
  }
  absl::Status status = versions_->Reset(meta.version, previous);
  if (status.ok()) {
    status = LoadStatePart(*reader, chunks(), map_, *state_, versions_->base_data(), spec_.dtype,
                           versions_->previous_data());
  }
  // The restored version came from a step the checkpoint describes: undoing
  // it gives the stored previous version but for a few corrections.
  versions_->CommitBase(previous == ParamVersions::Previous::kStored && versions_->from_master()
                            ? UndoOf(RestoredStepConstants(meta))
                            : ParamVersions::Undo());
  const LastStep last = LastStepOf(meta, spec_.config);
  if (last.derived) {
    ZO_LOG(INFO) << "job " << spec_.name << ": checkpoint " << request.path()
                 << " predates last_step; last_lr recomputed from the schedule, last_grad_norm "
                    "reads 0 until the next step";
  }
  checkpoints_.Restored(meta.version);
  if (compensation_ != nullptr) compensation_->Forget(meta.version);
  position_.EndRestore(meta, last,
                       previous == ParamVersions::Previous::kNone ? meta.version : meta.version - 1,
                       status, request.path(), healthy_after);
  return status;
}

}  // namespace zo
