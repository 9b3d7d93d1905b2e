#include "server/job.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "common/convert.h"
#include "common/dpu_policy.h"
#include "common/host_memory.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "offload/adam_undo.h"
#include "offload/io/fault_injecting_backend.h"
#include "offload/io/io_engine.h"
#include "offload/optimizer_kernels.h"
#include "offload/tier/swap_layout.h"
#include "rpc/error_detail.h"
#include "rpc/job_move.h"
#include "rpc/proto_convert.h"
#include "server/job_internal.h"
#include "server/state_checkpoint.h"

namespace zo {
namespace {

// state_mu_ for the step thread, with the flag that makes a snapshot's
// background capture stand back between its slices (std::mutex is not fair:
// a thread that relocks at once could otherwise keep the step waiting).
// What a checkpoint snapshot's step hook may hold in copies for the
// background writer (kept across checkpoints, at most what was used).
constexpr int64_t kSnapshotStagingBytes = int64_t{1} << 30;

class StepStateLock {
 public:
  StepStateLock(std::mutex& mu, std::atomic<bool>& wants) : wants_(wants) {
    wants_.store(true);
    lock_ = std::unique_lock(mu);
  }
  ~StepStateLock() {
    lock_.unlock();
    wants_.store(false);
    wants_.notify_all();
  }

 private:
  std::atomic<bool>& wants_;
  std::unique_lock<std::mutex> lock_;
};

}  // namespace

using job_internal::RoundMaster;

namespace {

constexpr int64_t kStateBytesPerElem = 12;  // master, m, v
constexpr int kScaleHistory = 8;

// "[begin, begin + n)" for a message; the sum cannot overflow, since
// `begin` comes off the wire and may be anything.
std::string ElementRange(int64_t begin, int64_t n) {
  int64_t end;
  if (__builtin_add_overflow(begin, n, &end))
    return absl::StrCat("[", begin, ", ", begin, " + ", n, ")");
  return absl::StrCat("[", begin, ", ", end, ")");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Job>> Job::Create(JobSpec spec, const JobResources& resources) {
  if (resources.wakes == nullptr) {
    return absl::InvalidArgumentError("a job needs a WakeQueue for its waiting calls");
  }
  std::unique_ptr<Job> job(new Job(std::move(spec), resources));
  ZO_RETURN_IF_ERROR(job->Init());
  job->step_thread_ = std::thread([j = job.get()] { j->StepLoop(); });
  return job;
}

uint64_t job_internal::NewIncarnation() {
  std::random_device rd;
  for (;;) {
    const uint64_t id = (uint64_t{rd()} << 32) ^ rd();
    if (id != 0) return id;
  }
}

Job::Job(JobSpec spec, const JobResources& resources)
    : spec_(std::move(spec)),
      resources_(resources),
      map_(*spec_.shard_map),
      incarnation_(job_internal::NewIncarnation()) {}

absl::Status Job::CheckHostMemory(const TieredStateOptions& options) const {
  const std::optional<int64_t> available =
      resources_.available_ram ? resources_.available_ram() : AvailableHostMemory();
  if (!available.has_value()) return absl::OkStatus();  // cannot tell: allocation decides
  const SwapLayout layout(local_elems_, options.sub_group_elems,
                          options.swap_dir.empty() ? -1 : options.ram_budget_bytes);
  const int64_t lp = static_cast<int64_t>(DTypeSize(spec_.dtype));
  const int64_t contributors = spec_.dp_world_size * PushesPerRank(spec_.config);
  const int64_t state = layout.ram_elems() * kStateBytesPerElem +
                        (layout.nvme_sub_groups() > 0
                             ? std::min<int64_t>(options.buffer_count, layout.nvme_sub_groups()) *
                                   static_cast<int64_t>(layout.slot_bytes())
                             : 0);
  const int64_t gradients = local_elems_ * (contributors == 1 ? lp : 4);
  const int64_t versions = ParamVersions::BufferBytes(local_elems_, spec_.dtype,
                                                      ServesFromMaster(layout.nvme_sub_groups()));
  // A checkpoint's staging copies (at most the whole state, in tile buffers,
  // and at most kSnapshotStagingBytes), kept once a checkpoint has run.
  const int64_t staging_buffer = 3 * kTileElems * static_cast<int64_t>(sizeof(float));
  const int64_t staging =
      resources_.checkpoint_root.empty()
          ? 0
          : std::min(kSnapshotStagingBytes / staging_buffer,
                     (local_elems_ * kStateBytesPerElem + staging_buffer - 1) / staging_buffer) *
                staging_buffer;
  const int64_t needed = state + gradients + versions + staging;
  if (needed <= *available) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "job ", spec_.name, " needs ", FormatBytes(needed), " of RAM on this server (",
      FormatBytes(state), " optimizer state, ", FormatBytes(gradients), " gradients, ",
      FormatBytes(versions), " weights served to pulls, ", FormatBytes(staging),
      " checkpoint staging) and ", FormatBytes(*available),
      " is available (the host's MemAvailable, or what the server's memory cgroup has left where "
      "that is less); put the optimizer state on NVMe (zero_optimization.offload_optimizer) "
      "or add servers"));
}

absl::Status Job::Init() {
  const int s = spec_.server_index;
  std::vector<LocalChunk> owned;
  for (int64_t c : map_.ChunksOfServer(s)) {
    const int64_t elems = map_.ChunkRange(c).size();
    owned.push_back({.id = c, .local_offset = local_elems_, .elems = elems});
    local_elems_ += elems;
  }

  groups_.emplace(spec_.config, map_, s);
  const Config& config = spec_.config;
  const OffloadOptimizerConfig& offload = config.zero_optimization.offload_optimizer;
  TieredStateOptions options;
  options.sub_group_elems = config.zero_optimization.sub_group_size;
  options.buffer_count = offload.buffer_count;
  options.checksums = config.zo.nvme_checksums;
  options.io = IoEngineOptionsFromConfig(config.aio);
  const int64_t state_bytes = local_elems_ * kStateBytesPerElem;
  if (offload.device == OffloadDevice::kNvme) {
    const std::string root =
        resources_.nvme_root.empty() ? offload.nvme_path : resources_.nvme_root;
    options.swap_dir =
        (std::filesystem::path(root) / absl::StrCat(spec_.name, ".server", s)).string();
    options.ram_budget_bytes = std::max<int64_t>(resources_.ram_budget_bytes, 0);
  } else if (resources_.ram_budget_bytes >= 0 && state_bytes > resources_.ram_budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", spec_.name, " needs ", FormatBytes(state_bytes),
        " of optimizer state on this server, more than the memory budget of ",
        FormatBytes(resources_.ram_budget_bytes),
        "; set zero_optimization.offload_optimizer.device to \"nvme\" or add servers"));
  }
  ZO_RETURN_IF_ERROR(CheckHostMemory(options));
  TieredStateSeams seams;
  if (resources_.nvme_latency > absl::ZeroDuration()) {
    seams.make_engine =
        [latency = resources_.nvme_latency](
            const IoEngineOptions& io) -> absl::StatusOr<std::unique_ptr<IoEngine>> {
      ZO_ASSIGN_OR_RETURN(std::unique_ptr<IoBackend> backend, CreateIoBackend(io));
      FaultPlan plan;
      plan.faults.push_back(IoFault::Slow(latency));
      return CreateFaultInjectingEngine(io, std::move(backend), std::move(plan));
    };
  }
  ZO_ASSIGN_OR_RETURN(state_, TieredOptimizerState::Create(options, local_elems_, resources_.pool,
                                                           std::move(seams)));
  // A step's snapshot hook copies one tile (master, m, v) per buffer.
  snapshot_staging_ = std::make_shared<SnapshotStaging>(kSnapshotStagingBytes, 3 * kTileElems);
  ZO_ASSIGN_OR_RETURN(accum_, GradientAccumulator::Create({
                                  .job = spec_.name,
                                  .chunks = std::move(owned),
                                  .dp_world_size = spec_.dp_world_size,
                                  .pushes_per_rank = static_cast<int>(PushesPerRank(spec_.config)),
                                  .dtype = spec_.dtype,
                                  .pool = resources_.pool,
                                  .wakes = resources_.wakes,
                                  // The step thread waits on cv_ for Ready().
                                  .on_ready =
                                      [this] {
                                        std::lock_guard lock(mu_);
                                        cv_.notify_all();
                                      },
                              }));
  if (ServesFromMaster(state_->nvme_sub_groups())) {
    ZO_ASSIGN_OR_RETURN(versions_, ParamVersions::CreateFromMaster(
                                       local_elems_, spec_.dtype,
                                       {.round_master =
                                            [this](int64_t offset, int64_t n, void* out) {
                                              RoundMaster(state_->ram_master() + offset, out,
                                                          static_cast<size_t>(n), spec_.dtype);
                                            },
                                        .keep_previous = spec_.config.zo.dpu.enabled}));
    fills_ = std::make_unique<PullFills>(DTypeSize(spec_.dtype));
  } else {
    ZO_ASSIGN_OR_RETURN(versions_, ParamVersions::Create(local_elems_, spec_.dtype));
  }

  scale_after_version_[0] = LossScaler::FromConfig(config).scale();
  coordinator_ = std::make_unique<StepCoordinator>(StepCoordinator::Options{
      .job = spec_.name,
      .map = &map_,
      .server_index = s,
      .dp_world_size = spec_.dp_world_size,
      .config = &spec_.config,
      .num_groups = groups_->num_groups(),
      .report_stats =
          [this](const v1::StepStats& stats) {
            absl::Status reported =
                resources_.peers->ReportStepStats(spec_.servers[0], stats, resources_.peer_timeout);
            if (ReasonOf(reported) == v1::ErrorDetail::NO_JOB) LeadLostTheJob(reported);
            if (reported.ok()) LeadAnswered();
            return reported;
          },
      .send_commit =
          [this](int server, const v1::StepCommit& commit) {
            absl::Status sent = resources_.peers->CommitStep(spec_.servers[server], commit,
                                                             resources_.peer_timeout);
            if (is_lead()) recovery_.Heard(server, sent);
            return sent;
          },
      .probe =
          [this](int server) {
            if (is_lead()) recovery_.ProbeOne(server);
          },
      .initial_backoff = absl::Milliseconds(50),
  });
  step_open_time_ = absl::Now();
  ZO_LOG(INFO) << "job " << spec_.name << ": server " << s << " of " << spec_.servers.size() << ", "
               << chunks().size() << " chunks, " << FormatCount(local_elems_) << " elements here ("
               << state_->nvme_sub_groups() << " of " << state_->num_sub_groups()
               << " sub-groups on NVMe), dp " << spec_.dp_world_size << ", "
               << DTypeName(spec_.dtype);
  return absl::OkStatus();
}

Job::~Job() { Stop(); }

void Job::Stop(absl::Status reason) {
  {
    std::lock_guard state_lock(state_mu_);
    DropSnapshotLocked(absl::UnavailableError("the job is shutting down"));
  }
  {
    std::lock_guard lock(mu_);
    if (!stop_) stop_reason_ = std::move(reason);
    stop_ = true;
    resources_.wakes->Post(version_waiters_.TakeAll());  // Create checked it is set
    if (accum_ != nullptr) accum_->Close(stop_reason_);
    if (coordinator_ != nullptr) coordinator_->Stop();
    checkpoints_.Stop();
  }
  cv_.notify_all();
  if (step_thread_.joinable() && std::this_thread::get_id() != step_thread_.get_id()) {
    step_thread_.join();
    checkpoints_.Join();
  }
  recovery_.Join();
}

v1::JobStatus Job::Status() const {
  std::lock_guard lock(mu_);
  v1::JobStatus st;
  st.set_job(spec_.name);
  st.set_version(version_);
  st.set_open_step(open_step_);
  st.set_applied_steps(applied_steps_);
  st.set_loss_scale(ScaleForVersionLocked(version_));
  health_.AddTo(st);
  if (coordinator_ != nullptr) st.set_waiting_on_peer(coordinator_->StallDescription());
  st.set_server_index(spec_.server_index);
  st.set_num_servers(static_cast<int>(spec_.servers.size()));
  for (const std::string& server : spec_.servers) st.add_servers(server);
  st.set_incarnation(incarnation_.load());
  st.set_init_fingerprint(spec_.init_fingerprint);
  checkpoints_.AddTo(st);
  if (is_lead()) {
    for (v1::FollowerState& f : recovery_.followers().States()) *st.add_followers() = std::move(f);
  }
  st.set_dp_world_size(spec_.dp_world_size);
  st.set_total_elems(map_.total_elems());
  st.set_local_elems(local_elems_);
  const int64_t nvme =
      state_->nvme_sub_groups() == 0
          ? 0
          : local_elems_ -
                std::min(local_elems_,
                         state_->ram_sub_groups() * spec_.config.zero_optimization.sub_group_size);
  st.set_nvme_elems(nvme);
  st.set_last_grad_norm(last_grad_norm_);
  st.set_last_skipped(last_skipped_);
  st.set_last_lr(last_lr_);
  st.set_base_version(oldest_version_);
  st.set_waiting_pulls(version_waiters_.size());
  st.set_waiting_pushes(accum_->waiting());
  st.set_ram_bytes(state_->ram_bytes() + accum_->buffer_bytes() + versions_->buffer_bytes() +
                   snapshot_staging_->held_bytes());
  return st;
}

v1::JobStatus Job::StatusForAttach(absl::Duration max_wait) const {
  {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, absl::ToChronoNanoseconds(max_wait), [&] { return !applying_ || stop_; });
  }
  return Status();
}

double Job::ScaleForVersionLocked(int64_t version) const {
  auto it = scale_after_version_.upper_bound(version);
  if (it == scale_after_version_.begin()) return scale_after_version_.begin()->second;
  return std::prev(it)->second;
}

absl::StatusOr<int> Job::LocalChunkIndex(int64_t chunk) const {
  if (chunk < 0 || chunk >= map_.num_chunks()) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk, " does not exist: job ",
                                                   spec_.name, " has ", map_.num_chunks(),
                                                   " chunks"));
  }
  const int owner = map_.ServerOfChunk(chunk);
  if (owner != spec_.server_index) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk, " lives on server ", owner,
                                                   " (", spec_.servers[owner], "), this is server ",
                                                   spec_.server_index));
  }
  return static_cast<int>(chunk / map_.num_servers());
}

// ---------------------------------------------------------------- worker calls

absl::Status Job::InitParams(const v1::ParamInitPiece& piece) {
  ZO_ASSIGN_OR_RETURN(const int i, LocalChunkIndex(piece.chunk()));
  const LocalChunk& c = chunks()[i];
  if (piece.data().empty() || piece.data().size() % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial weights of chunk ", piece.chunk(), ": ", piece.data().size(),
                     " bytes is not a positive multiple of 4 (fp32)"));
  }
  const int64_t n = static_cast<int64_t>(piece.data().size() / 4);
  if (piece.offset() < 0 || piece.offset() > c.elems - n) {
    return absl::OutOfRangeError(
        absl::StrCat("initial weights: elements ", ElementRange(piece.offset(), n),
                     " are outside chunk ", piece.chunk(), " of ", c.elems, " elements"));
  }
  std::lock_guard state_lock(state_mu_);
  {
    std::lock_guard lock(mu_);
    ZO_RETURN_IF_ERROR(health_.status());
    if (version_ != 0 || applied_steps_ != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", spec_.name, " is at version ", version_,
                       "; initial weights are accepted only at version 0"));
    }
  }
  // A checkpoint of version 0 taken before these weights would hold neither.
  DropSnapshotLocked(absl::AbortedError(absl::StrCat(
      "job ", spec_.name, " got initial weights while its version 0 was checkpointed")));
  std::vector<float> values(static_cast<size_t>(n));
  std::memcpy(values.data(), piece.data().data(), piece.data().size());
  ZO_RETURN_IF_ERROR(state_->LoadMaster(c.local_offset + piece.offset(), values));
  if (char* lp = static_cast<char*>(versions_->base_data()); lp != nullptr) {
    RoundMaster(values.data(), lp + (c.local_offset + piece.offset()) * DTypeSize(spec_.dtype),
                values.size(), spec_.dtype);
  }
  return absl::OkStatus();
}

absl::Status Job::CheckIncarnation(uint64_t incarnation) const {
  if (incarnation == 0 || incarnation == incarnation_.load(std::memory_order_relaxed)) {
    return absl::OkStatus();
  }
  std::lock_guard lock(mu_);
  // The caller opened an earlier instance of the job: this one is where the
  // job is now, at the version it was opened or restored at.
  return JobMovedError({.job = spec_.name, .servers = spec_.servers, .version = base_version_});
}

absl::StatusOr<int> Job::PushedChunkIndex(const GradientPieceView& piece) const {
  ZO_RETURN_IF_ERROR(CheckIncarnation(piece.incarnation));
  ZO_ASSIGN_OR_RETURN(const int i, LocalChunkIndex(piece.chunk));
  absl::StatusOr<DType> dtype = DTypeFromProto(piece.dtype);
  if (!dtype.ok() || *dtype != spec_.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("gradient dtype ", v1::DType_Name(piece.dtype),
                                                   " is not the job's ",
                                                   std::string(DTypeName(spec_.dtype))));
  }
  return i;
}

absl::StatusOr<GradientAccumulator::PushOutcome> Job::TryPushGradient(
    const GradientPieceView& piece, GradientAccumulator::PushWait* wait,
    std::function<void()> wake) {
  ZO_ASSIGN_OR_RETURN(const int i, PushedChunkIndex(piece));
  absl::StatusOr<GradientAccumulator::PushOutcome> outcome =
      accum_->TryPush(i, piece, wait, std::move(wake));
  if (!outcome.ok()) return RestoredSince(piece, outcome.status());
  if (*outcome == GradientAccumulator::PushOutcome::kAdded) {
    counters_.AddGradientBytes(static_cast<int64_t>(piece.data_bytes));
  }
  return outcome;
}

absl::Status Job::RestoredSince(const GradientPieceView& piece, absl::Status error) const {
  // A restore between the piece's checks and the accumulator (or while it
  // waited) undid its step: say where the job is now.
  if (absl::Status moved = CheckIncarnation(piece.incarnation); !moved.ok()) return moved;
  return error;
}

bool Job::CancelPushWait(const GradientPieceView& piece,
                         const GradientAccumulator::PushWait& wait) {
  const absl::StatusOr<int> i = LocalChunkIndex(piece.chunk);
  return i.ok() && accum_->CancelWait(*i, wait);
}

absl::Status Job::PushGradient(const GradientPieceView& piece, absl::Time deadline) {
  ZO_ASSIGN_OR_RETURN(const int i, PushedChunkIndex(piece));
  if (absl::Status pushed = accum_->Push(i, piece, deadline); !pushed.ok()) {
    return RestoredSince(piece, std::move(pushed));
  }
  counters_.AddGradientBytes(static_cast<int64_t>(piece.data_bytes));
  return absl::OkStatus();
}

absl::Status Job::CheckPullRequest(const v1::PullParamsRequest& request) const {
  ZO_RETURN_IF_ERROR(CheckIncarnation(request.incarnation()));
  for (int t : request.tensors()) {
    if (t < 0 || t >= static_cast<int>(map_.tensors().size())) {
      return absl::InvalidArgumentError(absl::StrCat("tensor index ", t, " is outside the ",
                                                     map_.tensors().size(), "-tensor manifest"));
    }
  }
  if (request.version() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("version ", request.version(), " < 0"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Job::AwaitVersion(int64_t version, std::function<void()> wake,
                                       WaitList::Ticket* ticket, bool while_written) {
  std::lock_guard lock(mu_);
  *ticket = WaitList::kNone;
  if (stop_) return stop_reason_;
  // Until a restore ends, versions the job has are being replaced (and
  // may be ones it will not have).
  if (health_.restoring()) {
    *ticket = version_waiters_.Add(version, std::move(wake));
    return false;
  }
  if (version_ >= version || (while_written && writing_version_ == version)) return true;
  if (!health_.ok()) {
    const absl::Status why = health_.NeedsRestore();
    return absl::Status(why.code(),
                        absl::StrCat("version ", version, " will not come yet: ", why.message()));
  }
  *ticket = version_waiters_.Add(version, std::move(wake));
  return false;
}

bool Job::CancelVersionWait(WaitList::Ticket ticket) {
  std::lock_guard lock(mu_);
  return version_waiters_.Remove(ticket);
}

absl::Status Job::WaitForVersion(int64_t version, absl::Time deadline, uint64_t incarnation) {
  for (;;) {
    ZO_RETURN_IF_ERROR(CheckIncarnation(incarnation));
    auto woken = std::make_shared<absl::Notification>();
    WaitList::Ticket ticket;
    ZO_ASSIGN_OR_RETURN(const bool has, AwaitVersion(
                                            version, [woken] { woken->Notify(); }, &ticket));
    if (has) return absl::OkStatus();
    if (!woken->WaitForNotificationWithDeadline(deadline) && CancelVersionWait(ticket)) {
      std::lock_guard lock(mu_);
      return absl::DeadlineExceededError(
          absl::StrCat("version ", version, " of job ", spec_.name,
                       " did not exist before the deadline (the job is at version ", version_,
                       ", waiting for gradients of step ", open_step_, ")"));
    }
  }
}

absl::Status Job::AwaitWritten(int64_t version) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return writing_version_ != version || stop_; });
  if (version_ >= version) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("version ", version, " of job ", spec_.name,
                   " was read as its update wrote it, but the update did not end it (the job is "
                   "at version ",
                   version_, "): pull again"));
}

absl::StatusOr<PullCursor> Job::OpenPull(const v1::PullParamsRequest& request, bool while_written) {
  ZO_RETURN_IF_ERROR(CheckPullRequest(request));
  double loss_scale = 1.0;
  int64_t restores_begun = 0;
  {
    std::lock_guard lock(mu_);
    if (health_.restoring()) return RestoredWhileOpening();
    restores_begun = health_.restores_begun();
    if (version_ < request.version() && !(while_written && writing_version_ == request.version())) {
      return absl::FailedPreconditionError(absl::StrCat("version ", request.version(), " of job ",
                                                        spec_.name, " does not exist yet"));
    }
    loss_scale = ScaleForVersionLocked(request.version());
  }
  if (request.have_version() >= 0) {
    const std::optional<int64_t> want = versions_->DataVersion(request.version());
    const std::optional<int64_t> have = versions_->DataVersion(request.have_version());
    if (want.has_value() && want == have)
      return PullCursor::Unchanged(request.version(), loss_scale);
  }
  absl::StatusOr<ParamVersions::Lease> lease = versions_->Acquire(request.version());
  if (!lease.ok()) {
    // A restore that began since the checks above replaced the versions.
    ZO_RETURN_IF_ERROR(CheckIncarnation(request.incarnation()));
    std::lock_guard lock(mu_);
    if (health_.restoring() || health_.restores_begun() != restores_begun) {
      return RestoredWhileOpening();
    }
    return lease.status();
  }
  return PullCursor::Serving(request.version(), loss_scale, spec_.dtype, *std::move(lease),
                             PullRanges(request));
}

std::vector<PullCursor::Range> Job::PullRanges(const v1::PullParamsRequest& request) const {
  std::vector<int> tensors(request.tensors().begin(), request.tensors().end());
  if (tensors.empty()) {
    for (int t = 0; t < static_cast<int>(map_.tensors().size()); ++t) tensors.push_back(t);
  }
  std::vector<PullCursor::Range> ranges;
  for (int t : tensors) {
    for (const TensorPiece& p : map_.PiecesOfTensor(t)) {
      if (p.server != spec_.server_index) continue;
      const int64_t local = chunks()[p.chunk / map_.num_servers()].local_offset + p.chunk_offset;
      ranges.push_back({t, p.tensor_offset, local, p.length});
    }
  }
  return ranges;
}

absl::StatusOr<PullFills::Id> Job::RegisterPull(const v1::PullParamsRequest& request,
                                                InProcessRoute::Place place) {
  ZO_RETURN_IF_ERROR(CheckPullRequest(request));
  if (!CanFill(request.version())) return 0;
  std::vector<PullFills::Copy> copies;
  for (const PullCursor::Range& r : PullRanges(request)) {
    ZO_ASSIGN_OR_RETURN(std::byte * dst, place({r.tensor, r.tensor_offset, r.elems}));
    copies.push_back({r.local_offset, r.elems, dst});
  }
  return RegisterCopies(request.version(), std::move(copies));
}

absl::StatusOr<PullFills::Id> Job::RegisterPullInto(const v1::PullParamsRequest& request,
                                                    absl::Span<std::byte> area) {
  ZO_RETURN_IF_ERROR(CheckPullRequest(request));
  if (!CanFill(request.version())) return 0;
  const int64_t elem = static_cast<int64_t>(DTypeSize(spec_.dtype));
  std::vector<PullFills::Copy> copies;
  for (const PullCursor::Range& r : PullRanges(request)) {
    // A range the area cannot hold is left to the cursor, which says so.
    if ((r.local_offset + r.elems) * elem > static_cast<int64_t>(area.size())) return 0;
    copies.push_back({r.local_offset, r.elems, area.data() + r.local_offset * elem});
  }
  return RegisterCopies(request.version(), std::move(copies));
}

bool Job::CanFill(int64_t version) const {
  if (fills_ == nullptr) return false;
  std::lock_guard lock(mu_);
  return !health_.restoring() && !stop_ && version == version_ + 1;
}

absl::StatusOr<PullFills::Id> Job::RegisterCopies(int64_t version,
                                                  std::vector<PullFills::Copy> copies) {
  std::lock_guard lock(mu_);  // the update begins under it too
  if (health_.restoring() || stop_) return 0;
  if (version == version_ + 1 && writing_version_ < 0) {
    return fills_->Register(version, std::move(copies), nullptr);
  }
  if (version == writing_version_) {
    return fills_->Register(version, std::move(copies),
                            [&] { return versions_->DoneRanges(version); });
  }
  return 0;
}

std::optional<InProcessRoute::PullResult> Job::TakeFilledPull(int64_t version, PullFills::Id id) {
  if (fills_ == nullptr || id == 0) return std::nullopt;
  // What the update had done when the pull registered is read here (it is
  // final), while the update fills the rest.
  std::optional<ParamVersions::Lease> lease;
  const absl::Status read =
      fills_->ReadDoneBefore(id, [&](int64_t from, int64_t n, std::byte* dst) -> absl::Status {
        if (!lease.has_value()) {
          ZO_ASSIGN_OR_RETURN(ParamVersions::Lease acquired, versions_->Acquire(version));
          lease.emplace(std::move(acquired));
        }
        return lease->Read(from, n, dst);
      });
  const std::optional<int64_t> bytes = fills_->Take(id);
  if (!bytes.has_value() || !read.ok()) return std::nullopt;
  std::lock_guard lock(mu_);
  return InProcessRoute::PullResult{
      .unchanged = false, .loss_scale = ScaleForVersionLocked(version), .bytes = *bytes};
}

void Job::WithdrawPull(PullFills::Id id) {
  if (fills_ != nullptr && id != 0) fills_->Withdraw(id);
}

absl::Status Job::RestoredWhileOpening() const {
  // UNAVAILABLE: the client asks again, and then waits for the restore.
  return absl::UnavailableError(absl::StrCat("job ", spec_.name,
                                             " was being restored while this pull opened; "
                                             "pull again"));
}

absl::Status Job::PullParams(const v1::PullParamsRequest& request, absl::Time deadline,
                             const std::function<bool(const v1::ParamPiece&)>& emit) {
  const absl::Time start = absl::Now();
  ZO_RETURN_IF_ERROR(CheckPullRequest(request));
  ZO_RETURN_IF_ERROR(WaitForVersion(request.version(), deadline, request.incarnation()));
  ZO_ASSIGN_OR_RETURN(PullCursor cursor, OpenPull(request));
  v1::ParamPiece piece;
  while (cursor.Next(&piece)) {
    if (!emit(piece)) return absl::CancelledError("the caller went away");
  }
  ZO_RETURN_IF_ERROR(cursor.status());
  RecordPull(absl::Now() - start, cursor.bytes_given());
  return absl::OkStatus();
}

// ---------------------------------------------------------------- the step

bool Job::ReadyToReportLocked() const {
  // Between steps every chunk takes gradients for open_step_.
  return health_.ok() && accum_->Ready();
}

v1::StepStats Job::ComputeStepStats(int64_t step, int64_t generation) {
  v1::StepStats stats;
  stats.set_job(spec_.name);
  stats.set_step(step);
  stats.set_server_index(spec_.server_index);
  stats.set_generation(generation);
  if (chunks().empty()) return stats;
  const StepGradStats s = accum_->Stats();
  for (size_t i = 0; i < chunks().size(); ++i) {
    stats.add_chunks(chunks()[i].id);
    stats.add_chunk_sum_squares(s.per_chunk[i].sum_squares);
  }
  stats.set_non_finite(s.total.non_finite);
  return stats;
}

void Job::StepLoop() {
  std::unique_lock lock(mu_);
  for (;;) {
    if (applying_) {
      applying_ = false;
      cv_.notify_all();
    }
    const auto checkpoint_due = [&] {
      return is_lead() && checkpoints_.Due(version_, health_.ok());
    };
    const auto due = [&] {
      return stop_ || checkpoint_due() || (ReadyToReportLocked() && !checkpoints_.frozen());
    };
    // While the lead waits for gradients, it checks every few seconds that
    // its followers still have the job: one that restarted empty leaves the
    // workers unable to push, and nothing else would tell.
    while (!cv_.wait_for(lock, std::chrono::seconds(2), due)) {
      if (!is_lead() || spec_.servers.size() < 2 || checkpoints_.frozen()) continue;
      lock.unlock();
      recovery_.Probe();
      lock.lock();
    }
    if (stop_) return;
    if (checkpoint_due()) {
      const int64_t version = version_;
      const int64_t generation = generation_;
      const absl::Status health = health_.ok() ? absl::OkStatus() : health_.NeedsRestore();
      lock.unlock();
      checkpoints_.Run(version, generation, health);
      lock.lock();
      continue;
    }
    const int64_t step = open_step_;
    const int64_t generation = generation_;
    // The scale the step's gradients carry: with DPU, that of the older
    // version the workers computed on.
    const double scale_used =
        ScaleForVersionLocked(VersionForStep(spec_.config.zo.dpu, step, oldest_version_));
    lock.unlock();

    const absl::Time ready = absl::Now();
    v1::StepStats stats;
    {
      StepStateLock state_lock(state_mu_, step_wants_state_);
      stats = ComputeStepStats(step, generation);
    }
    const std::optional<v1::StepCommit> decided =
        is_lead() ? coordinator_->LeadRound(stats, scale_used) : coordinator_->FollowerRound(stats);
    lock.lock();
    if (!decided.has_value() || AbortedLocked(generation)) continue;
    const v1::StepCommit& commit = *decided;
    applying_ = true;
    lock.unlock();

    const absl::Time update_start = absl::Now();
    absl::Status applied;
    {
      StepStateLock state_lock(state_mu_, step_wants_state_);
      applied = Apply(commit);
    }
    const absl::Time update_end = absl::Now();
    lock.lock();
    writing_version_ = -1;
    // The pulls the update wrote are answered once the version is the
    // job's (a status asked after them shows it), or told it is not.
    absl::Cleanup fills_answered = [&] {
      if (fills_ != nullptr) fills_->EndUpdate(step, generation == generation_ && applied.ok());
    };
    if (generation != generation_) continue;
    if (!applied.ok()) {
      health_.Fail(applied);
      ZO_LOG(ERROR) << "job " << spec_.name << ": step " << step
                    << " failed; the job needs restore from a checkpoint: " << applied;
      cv_.notify_all();
      continue;
    }
    version_ = step;
    open_step_ = step + 1;
    coordinator_->Advance(step);
    applied_steps_ = commit.applied_steps();
    last_grad_norm_ = commit.grad_norm();
    last_skipped_ = commit.skip();
    if (!commit.skip()) {
      last_lr_ = commit.lr();
      last_group_lr_.assign(commit.group_lr().begin(), commit.group_lr().end());
    }
    scale_after_version_[step] = commit.next_loss_scale();
    while (scale_after_version_.size() > kScaleHistory) {
      scale_after_version_.erase(scale_after_version_.begin());
    }
    if (!commit.failure().empty()) {
      // Skipping on cannot help; a restore (after a config change) clears it.
      health_.Fail(absl::FailedPreconditionError(commit.failure()));
      ZO_LOG(ERROR) << commit.failure();
    }
    const absl::Duration wait = ready - step_open_time_;
    step_interval_ = update_end - step_open_time_;
    step_open_time_ = update_end;
    counters_.AddStep(commit.skip(), wait, update_end - update_start);
    // Pulls the update wrote are answered before the version's waiters wake.
    std::move(fills_answered).Invoke();
    resources_.wakes->Post(version_waiters_.TakeUpTo(version_));
    cv_.notify_all();
    LogStep(commit, wait, update_end - update_start);
  }
}

std::vector<double> Job::GroupLrOf(const v1::StepCommit& commit) const {
  if (commit.group_lr_size() > 0) return {commit.group_lr().begin(), commit.group_lr().end()};
  return std::vector<double>(static_cast<size_t>(groups_->num_groups()), commit.lr());
}

RangedConstants<AdamStepConstants> Job::RestoredStepConstants(const CheckpointMeta& meta) const {
  // The gradient's scale does not enter the undo.
  std::vector<double> lr = meta.last_group_lr;
  if (static_cast<int>(lr.size()) != groups_->num_groups()) {
    lr.assign(static_cast<size_t>(groups_->num_groups()), LastStepOf(meta, spec_.config).lr);
  }
  return groups_->StepConstants(lr, meta.applied_steps, 1.0);
}

void Job::FillPulls(const TieredOptimizerState::UpdatedTile& t) const {
  // The tile's new master is in this worker's cache: round it from there.
  fills_->Fill(t.offset, t.n, [&](int64_t from, int64_t n, std::byte* dst) {
    RoundMaster(t.p + (from - t.offset), dst, static_cast<size_t>(n), spec_.dtype);
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
    const RangedConstants<AdamStepConstants> c =
        groups_->StepConstants(GroupLrOf(commit), commit.applied_steps(), commit.grad_multiplier());
    // A checkpoint part that carries the version this update overwrites
    // writes it first (the background writer may have already).
    if (snapshot_ != nullptr) {
      snapshot_->CapturePrevious(/*from_a_step=*/true).IgnoreError();  // the part's failure
    }
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
      // ranges are done; they get its loss scale now. Waiters for it wake
      // (a gRPC pull's wait finds it not there yet and waits again).
      std::lock_guard lock(mu_);
      scale_after_version_[commit.step()] = commit.next_loss_scale();
      writing_version_ = commit.step();
      fills_->BeginUpdate(commit.step());
      resources_.wakes->Post(version_waiters_.TakeUpTo(writing_version_));
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
    // A checkpoint part in progress takes each tile as it was before this step.
    const absl::Status stepped = state_->AdamStep(
        c, accum_->gradients(), {lp, spec_.dtype},
        [&](int64_t end) { released = accum_->ReleaseBelow(released, end, commit.step()); },
        snapshot_ != nullptr ? snapshot_->observer() : StateObserver(), tile_done,
        keeps ? std::optional<DType>(DType::kFloat32) : std::nullopt);
    if (!stepped.ok()) {
      versions_->AbortWrite();
      DropSnapshotLocked(stepped);
    }
    ZO_RETURN_IF_ERROR(stepped);
    versions_->CommitWrite(commit.step());
  }
  accum_->Release(released, chunks().size(), commit.step());
  return absl::OkStatus();
}

void Job::HealthChangedLocked(const absl::Status& health) {
  if (stop_) return;  // closed for good
  if (health.ok()) {
    accum_->Reopen();
  } else {
    resources_.wakes->Post(version_waiters_.TakeAll());
    accum_->Close(health_.NeedsRestore());
  }
}

void Job::LogStep(const v1::StepCommit& commit, absl::Duration wait, absl::Duration update) {
  const int every = resources_.log_every > 0 ? resources_.log_every : spec_.config.steps_per_print;
  const absl::Duration serve = absl::Nanoseconds(serve_ns_.exchange(0));
  if (commit.step() % every != 0 && !commit.skip()) return;
  // With DPU from the master: what serving the previous version costs.
  std::string previous;
  if (versions_->from_master() && versions_->keep_previous()) {
    const ParamVersions::CorrectionStats c = versions_->corrections();
    previous = absl::StrFormat(" | previous version: %d corrections (%s)", c.elems,
                               FormatBytes(static_cast<double>(c.bytes)));
  }
  ZO_LOG(INFO) << absl::StrFormat(
      "job %s step %d: loss_scale %g grad_norm %.4g lr %.3g%s | wait %.1f ms update %.1f ms "
      "serve %.1f ms%s",
      spec_.name, commit.step(), commit.next_loss_scale(), commit.grad_norm(), commit.lr(),
      !commit.skip()             ? ""
      : commit.failure().empty() ? " SKIPPED (overflow)"
                                 : " SKIPPED",
      absl::ToDoubleMilliseconds(wait), absl::ToDoubleMilliseconds(update),
      absl::ToDoubleMilliseconds(serve), previous);
}

// ---------------------------------------------------------------- coordination

absl::Status Job::OnStepStats(const v1::StepStats& stats) {
  return coordinator_->OnStepStats(stats);
}

absl::Status Job::OnCommit(const v1::StepCommit& commit) { return coordinator_->OnCommit(commit); }

absl::Status Job::OnStepLr(const v1::StepLrRequest& request) {
  return coordinator_->OnStepLr(request.step(), request.dp_rank(), request.group_lr());
}

}  // namespace zo
