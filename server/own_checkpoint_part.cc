#include "server/own_checkpoint_part.h"

#include <filesystem>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "offload/checkpoint/checkpoint_dir.h"
#include "offload/tier/swap_layout.h"

namespace zo {
namespace {

// RAM elements a background capture reads per hold of the state (12 MiB of
// master, m and v): what a step may wait for it.
constexpr int64_t kSliceElems = int64_t{1} << 20;

}  // namespace

OwnCheckpointPart::OwnCheckpointPart(Options options, const ShardMap& map,
                                     std::vector<LocalChunk> chunks, TieredOptimizerState& state,
                                     JobStateLock& lock)
    : options_(std::move(options)),
      map_(map),
      chunks_(std::move(chunks)),
      state_(state),
      lock_(lock),
      // The step's hook copies one tile (master, m, v) per buffer.
      staging_(std::make_shared<SnapshotStaging>(options_.staging_bytes, 3 * kTileElems)) {}

std::string OwnCheckpointPart::PathIn(const std::string& dir) const {
  return (std::filesystem::path(dir) / CheckpointPartFileName(options_.server_index)).string();
}

absl::Status OwnCheckpointPart::BeginLocked(int64_t version, const std::string& dir,
                                            uint32_t previous_bytes, ParamVersions& versions) {
  // One left by a lead that never finished it (it failed, or died).
  DropLocked(absl::AbortedError(
      absl::StrCat("a checkpoint of version ", version, " began on this server after it")));
  std::optional<StateSnapshot::Previous> previous;
  if (previous_bytes != 0) {
    if (previous_bytes != DTypeSize(options_.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint of version ", version, " asks for the previous version in ",
                       previous_bytes, "-byte elements; job ", options_.job, " serves ",
                       std::string(DTypeName(options_.dtype))));
    }
    // Pinned until written: the next update waits for that.
    absl::StatusOr<ParamVersions::Lease> lease = versions.Acquire(version - 1);
    if (!lease.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint of version ", version, " needs the weights of version ",
                       version - 1, " on server ", options_.server_index,
                       ", which does not hold them: ", lease.status().message()));
    }
    previous.emplace(StateSnapshot::Previous{*std::move(lease), previous_bytes});
  }
  ZO_ASSIGN_OR_RETURN(snapshot_, StateSnapshot::Begin(PathIn(dir), chunks_, map_, version, staging_,
                                                      std::move(previous)));
  return absl::OkStatus();
}

absl::StatusOr<v1::WriteCheckpointPartResponse> OwnCheckpointPart::Finish(
    int64_t version, const std::string& dir, absl::Duration nvme_wait) {
  const std::string path = PathIn(dir);
  std::shared_ptr<StateSnapshot> snapshot;
  {
    std::lock_guard lock(lock_.mutex());
    if (snapshot_ == nullptr || snapshot_->path() != path || snapshot_->version() != version) {
      return absl::FailedPreconditionError(
          absl::StrCat("server ", options_.server_index, " has no checkpoint part of version ",
                       version, " begun at ", path, " (a restore or a later checkpoint ended it)"));
    }
    snapshot = snapshot_;
  }
  const absl::Status captured = Capture(*snapshot, nvme_wait);
  const absl::StatusOr<CheckpointPartSummary> summary =
      captured.ok() ? snapshot->Finish() : absl::StatusOr<CheckpointPartSummary>(captured);
  {
    std::lock_guard lock(lock_.mutex());
    if (snapshot_ == snapshot) snapshot_.reset();
  }
  if (!summary.ok()) return summary.status();
  v1::WriteCheckpointPartResponse response;
  response.set_file(summary->file);
  response.set_bytes(summary->bytes);
  response.set_index_checksum(absl::StrFormat("%016x", summary->index_checksum));
  return response;
}

absl::Status OwnCheckpointPart::Capture(StateSnapshot& snapshot, absl::Duration nvme_wait) {
  // First what the next update waits for.
  ZO_RETURN_IF_ERROR(snapshot.CapturePrevious());
  // RAM a slice at a time while the step thread does not want the state;
  // meanwhile (and while a step runs) the copies its hook staged are written.
  for (;;) {
    ZO_RETURN_IF_ERROR(snapshot.WriteStaged());
    std::unique_lock slice = lock_.TryForSlice();
    if (!slice.owns_lock()) {
      snapshot.WaitForWork(absl::Now() + absl::Milliseconds(5));
      continue;
    }
    ZO_ASSIGN_OR_RETURN(const bool more, snapshot.CaptureSomeFromRam(state_, kSliceElems));
    if (!more) break;
  }
  if (state_.nvme_sub_groups() > 0) {
    // NVMe: the next step carries it, if one comes soon.
    const absl::Time deadline = absl::Now() + nvme_wait;
    while (!snapshot.complete() && absl::Now() < deadline) {
      snapshot.WaitForWork(deadline);
      ZO_RETURN_IF_ERROR(snapshot.WriteStaged());
    }
  }
  ZO_RETURN_IF_ERROR(snapshot.WriteStaged());
  // Whatever is left (nothing, when a step carried it).
  std::lock_guard lock(lock_.mutex());
  return snapshot.CaptureRest(state_);
}

void OwnCheckpointPart::DropLocked(const absl::Status& why) {
  if (snapshot_ == nullptr) return;
  snapshot_->Abort(why);
  snapshot_.reset();
}

void OwnCheckpointPart::BeforeUpdateLocked() {
  if (snapshot_ != nullptr) {
    snapshot_->CapturePrevious(/*from_a_step=*/true).IgnoreError();  // the part's failure
  }
}

StateObserver OwnCheckpointPart::ObserverLocked() const {
  return snapshot_ != nullptr ? snapshot_->observer() : StateObserver();
}

}  // namespace zo
