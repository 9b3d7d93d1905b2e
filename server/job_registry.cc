#include "server/job_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "offload/checkpoint/checkpoint_dir.h"
#include "rpc/error_detail.h"
#include "rpc/proto_convert.h"

namespace zo {

absl::StatusOr<JobRegistry::Opened> JobRegistry::Open(JobSpec spec, bool attach_only,
                                                      bool by_lead) {
  if (!by_lead && spec.server_index > 0) {
    bool held;
    {
      std::lock_guard lock(mu_);
      held = jobs_.count(spec.name) > 0;
    }
    // Not under mu_: it is a call to another server. An attach-only caller
    // waits for the part to come back unless nobody will bring it back.
    if (!held) {
      const absl::Status lead = AskLeadBeforeCreating(spec);
      if (!lead.ok() && (!attach_only || ReasonOf(lead) == v1::ErrorDetail::NEEDS_RESTORE)) {
        return lead;
      }
    }
  }
  // A lead that creates a job its followers hold trained restarted empty.
  int64_t followers_version = 0;
  if (!attach_only && spec.server_index == 0 && spec.servers.size() > 1) {
    bool held;
    {
      std::lock_guard lock(mu_);
      held = jobs_.count(spec.name) > 0;
    }
    if (!held) {
      ZO_ASSIGN_OR_RETURN(followers_version, FollowersVersion(spec));
    }
  }
  // Creating a job allocates and may preallocate swap files: done under the
  // lock so that two racing opens of one job make one.
  std::lock_guard lock(mu_);
  auto it = jobs_.find(spec.name);
  if (it == jobs_.end() && attach_only) return NotHereLocked(spec.name);
  if (it != jobs_.end()) {
    if (!by_lead && it->second->AwaitingLeadRestore()) {
      return absl::UnavailableError(
          absl::StrCat("job ", spec.name, ": this server (server ", spec.server_index,
                       ") restarted and its part waits for the lead ", spec.servers[0],
                       " to roll the job back onto it; try again"));
    }
    const std::string mismatch = JobSpecMismatch(it->second->spec(), spec);
    if (!mismatch.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", spec.name, " exists with another description: ", mismatch));
    }
    const uint64_t kept = it->second->spec().init_fingerprint;
    if (kept != 0 && spec.init_fingerprint != 0 && kept != spec.init_fingerprint &&
        it->second->Status().version() == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", spec.name, " was opened from other initial weights (fingerprint ",
          absl::Hex(kept, absl::kZeroPad16), ", yours ",
          absl::Hex(spec.init_fingerprint, absl::kZeroPad16),
          "): a different model or seed; give every worker of a job the same start, or "
          "open another job name"));
    }
    return Opened{it->second, true};
  }
  if (static_cast<int>(jobs_.size()) >= resources_.max_jobs) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this server holds ", jobs_.size(),
                     " jobs, its --max-jobs: close one (zo-ctl close) or "
                     "open job ",
                     spec.name, " on other servers"));
  }
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<Job> job, Job::Create(std::move(spec), resources_));
  if (by_lead && job->spec().server_index > 0) job->AwaitLeadRestore();
  if (followers_version > 0) job->RecoverOwnPart(followers_version);
  std::shared_ptr<Job> shared = std::move(job);
  jobs_[shared->spec().name] = shared;
  moved_.erase(shared->spec().name);
  return Opened{shared, false};
}

absl::Status JobRegistry::NotHereLocked(const std::string& name) const {
  if (auto m = moved_.find(name); m != moved_.end()) return JobMovedError(m->second);
  return WithDetail(absl::NotFoundError(absl::StrCat("no job \"", name, "\" on this server")),
                    MakeDetail(v1::ErrorDetail::NO_JOB, name));
}

absl::StatusOr<int64_t> JobRegistry::FollowersVersion(const JobSpec& spec) const {
  int64_t version = 0;
  for (size_t i = 1; i < spec.servers.size(); ++i) {
    const absl::StatusOr<v1::JobStatus> follower = resources_.peers->GetJobStatus(
        spec.servers[i], spec.name, std::min(resources_.peer_timeout, absl::Seconds(2)),
        /*wait_for_ready=*/true);
    if (follower.ok()) {
      version = std::max(version, follower->version());
      continue;
    }
    // Without the job, or holding only where it moved (a rescale opens it
    // on new servers, some of which held it before): not trained there.
    const v1::ErrorDetail::Reason why = ReasonOf(follower.status());
    if (why == v1::ErrorDetail::NO_JOB || why == v1::ErrorDetail::JOB_MOVED) continue;
    return absl::UnavailableError(absl::StrCat(
        "the lead (", spec.servers[0], ") does not hold job ", spec.name, " and cannot ask server ",
        i, " (", spec.servers[i], ") whether that holds it trained (", follower.status().message(),
        "); a lead creates a job only once every follower has answered: try again"));
  }
  return version;
}

absl::Status JobRegistry::AskLeadBeforeCreating(const JobSpec& spec) const {
  const std::string& lead_address = spec.servers[0];
  const std::string here =
      absl::StrCat("server ", spec.server_index, " (", spec.servers[spec.server_index], ")");
  const absl::StatusOr<v1::JobStatus> lead = resources_.peers->GetJobStatus(
      lead_address, spec.name, std::min(resources_.peer_timeout, absl::Seconds(5)),
      /*wait_for_ready=*/true);
  if (!lead.ok()) {
    const v1::ErrorDetail::Reason why = ReasonOf(lead.status());
    if (why == v1::ErrorDetail::NO_JOB) return absl::OkStatus();  // a new job
    if (why == v1::ErrorDetail::JOB_MOVED) return lead.status();
    return absl::UnavailableError(
        absl::StrCat(here, " does not hold job ", spec.name, " and cannot ask its lead ",
                     lead_address, " whether that holds it trained (", lead.status().message(),
                     "); a follower creates its part only after asking: try again"));
  }
  if (lead->needs_restore().empty() && lead->version() == 0) return absl::OkStatus();
  if (!lead->needs_restore().empty() && !lead->restoring()) {
    return WithDetail(
        absl::FailedPreconditionError(absl::StrCat("job ", spec.name, " needs a restore: its lead ",
                                                   lead_address, " says ", lead->needs_restore())),
        MakeDetail(v1::ErrorDetail::NEEDS_RESTORE, spec.name));
  }
  return absl::UnavailableError(
      absl::StrCat(here, " restarted without its part of job ", spec.name, ", which the lead ",
                   lead_address, " holds at version ", lead->version(),
                   ": the lead rolls the job back onto it from its latest checkpoint; try again"));
}

absl::StatusOr<std::shared_ptr<Job>> JobRegistry::Find(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return NotHereLocked(name);
  return it->second;
}

absl::StatusOr<v1::CloseJobResponse> JobRegistry::Close(const std::string& name,
                                                        bool delete_checkpoints,
                                                        const std::optional<JobMove>& moved) {
  std::shared_ptr<Job> job;
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(name);
    if (it == jobs_.end()) return NotHereLocked(name);
    job = std::move(it->second);
    jobs_.erase(it);
    if (moved.has_value()) moved_[name] = *moved;
  }
  const v1::JobStatus last = job->Status();
  if (moved.has_value()) {
    job->Stop(JobMovedError(*moved));
  } else {
    job->Stop(absl::NotFoundError(absl::StrCat("job \"", name, "\" was closed on this server")));
  }
  v1::CloseJobResponse response;
  response.set_freed_ram_bytes(last.ram_bytes());
  response.set_freed_nvme_bytes(12 * last.nvme_elems());  // master, m, v
  std::string removed;
  if (delete_checkpoints && job->is_lead() && !resources_.checkpoint_root.empty()) {
    ZO_ASSIGN_OR_RETURN(std::vector<std::string> dirs,
                        RemoveJobCheckpoints(resources_.checkpoint_root, name));
    for (std::string& d : dirs) *response.add_removed_checkpoints() = std::move(d);
    removed = absl::StrCat(", ", response.removed_checkpoints_size(), " checkpoints removed");
  }
  ZO_LOG(INFO) << "job " << name << " closed at version " << last.version() << removed
               << (moved.has_value()
                       ? absl::StrCat(", moved to ", absl::StrJoin(moved->servers, ","))
                       : "");
  return response;
}

absl::StatusOr<v1::AdoptJobResponse> JobRegistry::Adopt(const std::string& checkpoint,
                                                        const std::vector<std::string>& servers,
                                                        absl::Time deadline) {
  ZO_ASSIGN_OR_RETURN(const CheckpointMeta meta, ReadCheckpointMeta(checkpoint));
  v1::OpenJobRequest request;
  request.set_job(meta.job);
  *request.mutable_manifest() = ManifestToProto(meta.manifest);
  request.set_config_json(meta.config_json);
  request.set_dp_world_size(meta.dp_world_size);
  // What the job started from goes with it: a worker with other initial
  // weights is told so, as on the servers that wrote the checkpoint.
  request.set_init_fingerprint(meta.init_fingerprint);
  for (const std::string& s : servers) request.add_servers(s);
  request.set_server_index(0);
  ZO_ASSIGN_OR_RETURN(JobSpec spec, JobSpecFromRequest(request));
  // The chunking may differ from the checkpoint's (it follows the server
  // count): a restore reads any checkpoint as one flat index space.
  // Where the job's tombstone here points, if it has one: a failed adoption
  // puts it back, so the workers keep waiting for the job there.
  std::optional<JobMove> tombstone;
  {
    std::lock_guard lock(mu_);
    if (jobs_.count(meta.job) > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", meta.job, " is open on this server: close it (or move it) before adopting"));
    }
    if (auto m = moved_.find(meta.job); m != moved_.end()) tombstone = m->second;
  }
  ZO_ASSIGN_OR_RETURN(Opened opened, Open(std::move(spec)));
  std::vector<std::string> opened_on;  // the followers
  const auto undo = [&](absl::Status why) {
    v1::CloseJobRequest close;
    close.set_job(meta.job);
    for (const std::string& s : opened_on) {
      (void)resources_.peers->CloseJob(s, close, resources_.peer_timeout);
    }
    (void)Close(meta.job, /*delete_checkpoints=*/false, tombstone);
    return absl::Status(why.code(),
                        absl::StrCat("adopting job ", meta.job, " from ", checkpoint, " on ",
                                     absl::StrJoin(servers, ","), ": ", why.message()));
  };
  request.set_by_lead(true);  // each follower's part waits for the restore below
  for (size_t i = 1; i < servers.size(); ++i) {
    request.set_server_index(static_cast<int>(i));
    // Bounded: a new server that is down fails the move in seconds.
    absl::StatusOr<v1::OpenJobResponse> follower = resources_.peers->OpenJob(
        servers[i], request, std::min(resources_.peer_timeout, absl::Seconds(5)));
    if (!follower.ok()) return undo(follower.status());
    opened_on.push_back(servers[i]);
    if (follower->attached()) {
      return undo(absl::FailedPreconditionError(
          absl::StrCat("server ", servers[i], " had the job open already")));
    }
  }
  absl::StatusOr<v1::RestoreResponse> restored = opened.job->Restore(checkpoint, deadline);
  if (!restored.ok()) return undo(restored.status());
  v1::AdoptJobResponse response;
  response.set_job(meta.job);
  response.set_version(restored->version());
  ZO_LOG(INFO) << "adopted job " << meta.job << " at version " << restored->version() << " on "
               << absl::StrJoin(servers, ",") << " from " << checkpoint;
  return response;
}

std::vector<std::string> JobRegistry::Names() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> names;
  for (const auto& [name, job] : jobs_) names.push_back(name);
  return names;
}

void JobRegistry::StopAll() {
  std::map<std::string, std::shared_ptr<Job>> jobs;
  {
    std::lock_guard lock(mu_);
    jobs = jobs_;
  }
  for (auto& [name, job] : jobs) job->Stop();
}

}  // namespace zo
