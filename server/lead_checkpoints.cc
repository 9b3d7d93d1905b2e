#include "server/lead_checkpoints.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace zo {

LeadCheckpoints::LeadCheckpoints(Options options, CheckpointActions actions)
    : options_(std::move(options)), actions_(std::move(actions)) {}

LeadCheckpoints::~LeadCheckpoints() {
  Stop();
  Join();
}

absl::StatusOr<v1::CheckpointResponse> LeadCheckpoints::Request(int64_t min_version,
                                                                absl::Time deadline, bool freeze) {
  if (options_.root.empty()) {
    return absl::FailedPreconditionError(
        "zo-server was started without --checkpoint-dir; checkpoints are off");
  }
  if (min_version < 0) {
    return absl::InvalidArgumentError(absl::StrCat("min_version ", min_version, " is negative"));
  }
  auto pending = std::make_shared<Pending>();
  pending->min_version = min_version;
  pending->freeze = freeze;
  std::future<absl::StatusOr<v1::CheckpointResponse>> done = pending->done.get_future();
  {
    std::lock_guard lock(mu_);
    if (stopped_) return absl::UnavailableError("the server is shutting down");
    waiting_.push_back(std::move(pending));
  }
  actions_.wake();
  if (done.wait_until(absl::ToChronoTime(deadline)) != std::future_status::ready) {
    return absl::DeadlineExceededError(
        "the checkpoint did not finish before the deadline; it runs between steps and will "
        "still be committed");
  }
  return done.get();
}

bool LeadCheckpoints::Due(int64_t version, bool healthy) const {
  std::lock_guard lock(mu_);
  if (running_) return false;
  return std::any_of(waiting_.begin(), waiting_.end(),
                     [&](const auto& p) { return p->min_version <= version || !healthy; });
}

void LeadCheckpoints::Run(int64_t version, int64_t generation, const absl::Status& health) {
  // The requests `version` satisfies; the others wait for their step.
  Requests requests;
  {
    std::lock_guard lock(mu_);
    Requests later;
    for (auto& p : waiting_) {
      (p->min_version <= version || !health.ok() ? requests : later).push_back(std::move(p));
    }
    waiting_.swap(later);
  }
  // A restore may have failed them since Due said so.
  if (requests.empty()) return;
  if (!health.ok()) {
    for (auto& r : requests) r->done.set_value(health);
    return;
  }
  const bool freeze =
      std::any_of(requests.begin(), requests.end(), [](const auto& r) { return r->freeze; });
  // running_ is false: the last one's thread has ended its work.
  if (thread_.joinable()) thread_.join();
  absl::StatusOr<Started> started = Start(version, generation);
  if (!started.ok() || freeze) {
    // A move holds the job at this version anyway: finish before stepping on.
    const absl::StatusOr<v1::CheckpointResponse> result =
        started.ok() ? Finish(*started) : started.status();
    std::lock_guard lock(mu_);
    DoneLocked(version, result, requests);
    return;
  }
  std::lock_guard lock(mu_);
  running_ = true;
  thread_ =
      std::thread([this, started = *std::move(started), requests = std::move(requests)]() mutable {
        const absl::StatusOr<v1::CheckpointResponse> result = Finish(started);
        {
          std::lock_guard lock(mu_);
          running_ = false;
          DoneLocked(started.version, result, requests);
        }
        actions_.wake();
      });
}

void LeadCheckpoints::DoneLocked(int64_t version,
                                 const absl::StatusOr<v1::CheckpointResponse>& result,
                                 Requests& requests) {
  if (!result.ok()) {
    ++failures_;
    last_error_ = absl::StrCat("step ", version, ": ", result.status().message());
    ZO_LOG(ERROR) << "job " << options_.job << ": checkpoint of version " << version
                  << " failed, training goes on: " << result.status();
  } else {
    last_error_.clear();
    last_step_ = std::max(last_step_, result->version());
    for (const auto& r : requests) {
      if (r->freeze && !frozen_) {
        frozen_ = true;
        ZO_LOG(INFO) << "job " << options_.job << ": frozen at version " << result->version()
                     << " for a move (" << result->path() << ")";
      }
    }
  }
  for (auto& r : requests) r->done.set_value(result);
}

absl::StatusOr<LeadCheckpoints::Started> LeadCheckpoints::Start(int64_t version,
                                                                int64_t generation) {
  Started started;
  started.version = version;
  started.generation = generation;
  started.start = absl::Now();
  ZO_ASSIGN_OR_RETURN(started.dir, BeginCheckpoint(options_.root, options_.job, version));
  const uint32_t previous_bytes = actions_.describe(version, started.meta);
  started.meta.version = version;
  if (absl::Status own = actions_.begin_own_part(version, started.dir, previous_bytes); !own.ok()) {
    (void)AbandonCheckpoint(started.dir);
    return own;
  }
  v1::WriteCheckpointPartRequest request;
  request.set_job(options_.job);
  request.set_version(version);
  request.set_dir(started.dir);
  request.set_generation(generation);
  request.set_phase(v1::WriteCheckpointPartRequest::BEGIN);
  request.set_previous_bytes(previous_bytes);
  // The followers are at `version` or about to be; none can step past it
  // before this loop returns, since the next step's commit comes from the
  // step loop that runs it.
  for (size_t i = 1; i < options_.servers.size(); ++i) {
    absl::StatusOr<v1::WriteCheckpointPartResponse> begun = options_.peers->WriteCheckpointPart(
        options_.servers[i], request, options_.peer_timeout * 10);
    actions_.heard(static_cast<int>(i), begun.status());
    if (!begun.ok()) {
      actions_.drop_own_part(begun.status());
      (void)AbandonCheckpoint(started.dir);
      return begun.status();
    }
  }
  return started;
}

absl::StatusOr<v1::CheckpointResponse> LeadCheckpoints::Finish(const Started& started) {
  absl::StatusOr<v1::CheckpointResponse> finished = CommitParts(started);
  // A failed attempt leaves no temporary directory behind.
  if (!finished.ok()) (void)AbandonCheckpoint(started.dir);
  return finished;
}

absl::StatusOr<v1::CheckpointResponse> LeadCheckpoints::CommitParts(const Started& started) {
  const int64_t version = started.version;
  ZO_ASSIGN_OR_RETURN(v1::WriteCheckpointPartResponse own,
                      actions_.finish_own_part(version, started.dir));
  const absl::Duration own_time = absl::Now() - started.start;
  std::vector<v1::WriteCheckpointPartResponse> parts = {own};
  v1::WriteCheckpointPartRequest request;
  request.set_job(options_.job);
  request.set_version(version);
  request.set_dir(started.dir);
  request.set_generation(started.generation);
  request.set_phase(v1::WriteCheckpointPartRequest::FINISH);
  for (size_t i = 1; i < options_.servers.size(); ++i) {
    absl::StatusOr<v1::WriteCheckpointPartResponse> part = options_.peers->WriteCheckpointPart(
        options_.servers[i], request, options_.peer_timeout * 10);
    actions_.heard(static_cast<int>(i), part.status());
    if (!part.ok()) return part.status();
    parts.push_back(*std::move(part));
  }
  CheckpointMeta meta = started.meta;
  for (const auto& p : parts) {
    uint64_t checksum = 0;
    if (!absl::SimpleHexAtoi(p.index_checksum(), &checksum)) {
      return absl::DataLossError(
          absl::StrCat("part ", p.file(), ": bad checksum \"", p.index_checksum(), "\""));
    }
    meta.parts.push_back({.file = p.file(), .bytes = p.bytes(), .index_checksum = checksum});
  }
  ZO_ASSIGN_OR_RETURN(const std::string path, CommitCheckpoint(started.dir, meta));
  ZO_LOG(INFO) << "job " << options_.job << ": checkpoint of version " << version
               << " committed at " << path << " (" << parts.size() << " parts, "
               << absl::StrFormat("%.2f s; this server's part %.2f s",
                                  absl::ToDoubleSeconds(absl::Now() - started.start),
                                  absl::ToDoubleSeconds(own_time))
               << ", steps went on meanwhile)";
  if (options_.keep > 0) {
    // The new checkpoint is committed: a failure here loses nothing.
    absl::StatusOr<std::vector<std::string>> removed =
        PruneCheckpoints(options_.root, options_.job, options_.keep);
    if (!removed.ok()) {
      ZO_LOG(WARNING) << "job " << options_.job
                      << ": pruning old checkpoints: " << removed.status();
    } else if (!removed->empty()) {
      ZO_LOG(INFO) << "job " << options_.job << ": removed " << removed->size()
                   << " old checkpoint(s), keeping " << options_.keep;
    }
  }
  v1::CheckpointResponse response;
  response.set_path(path);
  response.set_version(version);
  return response;
}

bool LeadCheckpoints::frozen() const {
  std::lock_guard lock(mu_);
  return frozen_;
}

bool LeadCheckpoints::Thaw() {
  {
    std::lock_guard lock(mu_);
    if (!frozen_) return false;
    frozen_ = false;
  }
  actions_.wake();
  return true;
}

void LeadCheckpoints::FailWaiting(const std::function<absl::Status(int64_t min_version)>& why) {
  std::lock_guard lock(mu_);
  for (auto& p : waiting_) p->done.set_value(why(p->min_version));
  waiting_.clear();
}

void LeadCheckpoints::Stop() {
  std::lock_guard lock(mu_);
  stopped_ = true;
  for (auto& p : waiting_) p->done.set_value(absl::UnavailableError("the job is shutting down"));
  waiting_.clear();
}

void LeadCheckpoints::Join() {
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
}

void LeadCheckpoints::Restored(int64_t version) {
  std::lock_guard lock(mu_);
  last_step_ = version;
}

void LeadCheckpoints::AddTo(v1::JobStatus& status) const {
  std::lock_guard lock(mu_);
  status.set_last_checkpoint_step(last_step_);
  status.set_last_checkpoint_error(last_error_);
  status.set_checkpoint_failures(failures_);
  status.set_frozen(frozen_);
}

size_t LeadCheckpoints::waiting() const {
  std::lock_guard lock(mu_);
  return waiting_.size();
}

bool LeadCheckpoints::running() const {
  std::lock_guard lock(mu_);
  return running_;
}

}  // namespace zo
