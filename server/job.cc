#include "server/job.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/convert.h"
#include "common/host_memory.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/units.h"
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

using job_internal::RoundMaster;

namespace {

using job_internal::kStateBytesPerElem;

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

absl::StatusOr<std::optional<int64_t>> Job::CheckHostMemory(
    const TieredStateOptions& options) const {
  const std::optional<int64_t> available =
      resources_.available_ram ? resources_.available_ram() : AvailableHostMemory();
  if (!available.has_value()) return std::nullopt;  // cannot tell: allocation decides
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
  // and at most OwnCheckpointPart's), kept once a checkpoint has run.
  const int64_t staging_buffer = 3 * kTileElems * static_cast<int64_t>(sizeof(float));
  const int64_t staging =
      resources_.checkpoint_root.empty()
          ? 0
          : std::min(OwnCheckpointPart::kDefaultStagingBytes / staging_buffer,
                     (local_elems_ * kStateBytesPerElem + staging_buffer - 1) / staging_buffer) *
                staging_buffer;
  const int64_t needed = state + gradients + versions + staging;
  if (needed <= *available) return *available - needed;
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
  std::vector<LocalChunk> owned;
  for (int64_t c : map_.ChunksOfServer(spec_.server_index)) {
    const int64_t elems = map_.ChunkRange(c).size();
    owned.push_back({.id = c, .local_offset = local_elems_, .elems = elems});
    local_elems_ += elems;
  }
  groups_.emplace(spec_.config, map_, spec_.server_index);
  if (spec_.config.zo.dpu.compensation != DpuCompensation::kNone) CreateCompensationRecord();
  ZO_ASSIGN_OR_RETURN(const TieredStateOptions options, OptimizerStateOptions());
  ZO_ASSIGN_OR_RETURN(const std::optional<int64_t> spare, CheckHostMemory(options));
  ZO_RETURN_IF_ERROR(CreateOptimizerState(options));
  SetUpSpeculation(spare);
  ZO_RETURN_IF_ERROR(CreateAccumulator(std::move(owned)));
  own_part_ = std::make_unique<OwnCheckpointPart>(
      OwnCheckpointPart::Options{
          .job = spec_.name, .server_index = spec_.server_index, .dtype = spec_.dtype},
      map_, chunks(), *state_, state_lock_);
  ZO_RETURN_IF_ERROR(CreateVersions());
  CreateCoordinator();
  position_.OpenStepNow();  // allocations done: the first step opens
  ZO_LOG(INFO) << "job " << spec_.name << ": server " << spec_.server_index << " of "
               << spec_.servers.size() << ", " << chunks().size() << " chunks, "
               << FormatCount(local_elems_) << " elements here (" << state_->nvme_sub_groups()
               << " of " << state_->num_sub_groups() << " sub-groups on NVMe), dp "
               << spec_.dp_world_size << ", " << DTypeName(spec_.dtype);
  return absl::OkStatus();
}

absl::StatusOr<TieredStateOptions> Job::OptimizerStateOptions() const {
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
        (std::filesystem::path(root) / absl::StrCat(spec_.name, ".server", spec_.server_index))
            .string();
    options.ram_budget_bytes = std::max<int64_t>(resources_.ram_budget_bytes, 0);
  } else if (resources_.ram_budget_bytes >= 0 && state_bytes > resources_.ram_budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", spec_.name, " needs ", FormatBytes(state_bytes),
        " of optimizer state on this server, more than the memory budget of ",
        FormatBytes(resources_.ram_budget_bytes),
        "; set zero_optimization.offload_optimizer.device to \"nvme\" or add servers"));
  }
  return options;
}

absl::Status Job::CreateOptimizerState(const TieredStateOptions& options) {
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
  return absl::OkStatus();
}

absl::Status Job::CreateAccumulator(std::vector<LocalChunk> owned) {
  ZO_ASSIGN_OR_RETURN(accum_, GradientAccumulator::Create({
                                  .job = spec_.name,
                                  .chunks = std::move(owned),
                                  .dp_world_size = spec_.dp_world_size,
                                  .pushes_per_rank = static_cast<int>(PushesPerRank(spec_.config)),
                                  .dtype = spec_.dtype,
                                  .pool = resources_.pool,
                                  .wakes = resources_.wakes,
                                  .track_filled = no_speculation_.empty(),
                                  .reads_lent = state_->tiles_on_grid(),
                                  // The step thread waits for Ready() or
                                  // a chunk to speculate on.
                                  .on_ready = [this] { position_.Notify(); },
                              }));
  return absl::OkStatus();
}

absl::Status Job::CreateVersions() {
  if (!ServesFromMaster(state_->nvme_sub_groups())) {
    ZO_ASSIGN_OR_RETURN(versions_, ParamVersions::Create(local_elems_, spec_.dtype));
    return absl::OkStatus();
  }
  ZO_ASSIGN_OR_RETURN(versions_, ParamVersions::CreateFromMaster(
                                     local_elems_, spec_.dtype,
                                     {.round_master =
                                          [this](int64_t offset, int64_t n, void* out) {
                                            RoundMaster(state_->ram_master() + offset, out,
                                                        static_cast<size_t>(n), spec_.dtype);
                                          },
                                      .keep_previous = spec_.config.zo.dpu.enabled}));
  fills_ = std::make_unique<PullFills>(DTypeSize(spec_.dtype));
  return absl::OkStatus();
}

void Job::CreateCompensationRecord() {
  std::vector<CompensationRecord::Part> parts;
  int64_t local = 0;
  for (int64_t c : map_.ChunksOfServer(spec_.server_index)) {
    for (const TensorPiece& piece : map_.PiecesOfChunk(c)) {
      const int group = map_.tensors()[static_cast<size_t>(piece.tensor)].group;
      const AdamHyperParams hp = groups_->HyperParams(group, 0.0);
      parts.push_back({.tensor = piece.tensor,
                       .begin = local,
                       .length = piece.length,
                       .group = group,
                       .hp = {.beta1 = hp.beta1,
                              .beta2 = hp.beta2,
                              .eps = hp.eps,
                              .weight_decay = hp.weight_decay,
                              .bias_correction = hp.bias_correction}});
      local += piece.length;
    }
  }
  compensation_ = std::make_unique<CompensationRecord>(std::move(parts));
}

void Job::CreateCoordinator() {
  coordinator_ = std::make_unique<StepCoordinator>(StepCoordinator::Options{
      .job = spec_.name,
      .map = &map_,
      .server_index = spec_.server_index,
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
}

Job::~Job() { Stop(); }

void Job::Stop(absl::Status reason) {
  {
    std::lock_guard state_lock(state_lock_.mutex());
    if (own_part_ != nullptr)
      own_part_->DropLocked(absl::UnavailableError("the job is shutting down"));
  }
  // From here the position's health hook no longer reopens the accumulator.
  const absl::Status stopped = position_.Stop(std::move(reason));
  if (accum_ != nullptr) accum_->Close(stopped);
  if (coordinator_ != nullptr) coordinator_->Stop();
  if (compensation_ != nullptr) compensation_->Stop(stopped);
  checkpoints_.Stop();
  if (step_thread_.joinable() && std::this_thread::get_id() != step_thread_.get_id()) {
    step_thread_.join();
    checkpoints_.Join();
  }
  recovery_.Join();
}

v1::JobStatus Job::Status() const {
  v1::JobStatus st;
  st.set_job(spec_.name);
  position_.AddTo(st);
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
  st.set_waiting_pushes(accum_->waiting());
  st.set_ram_bytes(state_->ram_bytes() + accum_->buffer_bytes() + versions_->buffer_bytes() +
                   own_part_->staging_held_bytes());
  const JobTotals totals = counters_.Totals();
  st.set_no_speculation(no_speculation_);
  st.set_speculated_chunks(totals.speculated_chunks);
  st.set_confirmed_chunks(totals.confirmed_chunks);
  st.set_redone_chunks(totals.redone_chunks);
  st.set_redo_seconds(totals.redo_seconds);
  return st;
}

v1::JobStatus Job::StatusForAttach(absl::Duration max_wait) const {
  position_.AwaitNotApplying(max_wait);
  return Status();
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
  std::lock_guard state_lock(state_lock_.mutex());
  ZO_RETURN_IF_ERROR(position_.CheckUnstepped());
  // A checkpoint of version 0 taken before these weights would hold neither.
  own_part_->DropLocked(absl::AbortedError(absl::StrCat(
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
  // The caller opened an earlier instance of the job: this one is where the
  // job is now, at the version it was opened or restored at.
  return JobMovedError(
      {.job = spec_.name, .servers = spec_.servers, .version = position_.base_version()});
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
    const GradientPieceView& piece, GradientAccumulator::PushWait* wait, std::function<void()> wake,
    std::shared_ptr<const void> lent) {
  ZO_ASSIGN_OR_RETURN(const int i, PushedChunkIndex(piece));
  absl::StatusOr<GradientAccumulator::PushOutcome> outcome =
      accum_->TryPush(i, piece, wait, std::move(wake), std::move(lent));
  if (!outcome.ok()) return RestoredSince(piece, outcome.status());
  if (*outcome == GradientAccumulator::PushOutcome::kAdded) {
    counters_.AddGradientBytes(static_cast<int64_t>(piece.data_bytes));
  }
  return outcome;
}

absl::StatusOr<absl::Span<std::byte>> Job::LendGradientPlace(const GradientPieceView& piece,
                                                             int64_t elems) {
  ZO_ASSIGN_OR_RETURN(const int i, PushedChunkIndex(piece));
  return accum_->LendPlace(i, piece.step, piece.offset, elems);
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

void Job::HealthChanged(const absl::Status& health) {
  if (accum_ == nullptr) return;  // Init has not made it yet
  if (health.ok()) {
    accum_->Reopen();
  } else {
    accum_->Close(health);
  }
}

}  // namespace zo
