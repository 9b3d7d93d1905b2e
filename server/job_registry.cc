#include "server/job_registry.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "offload/checkpoint/checkpoint_dir.h"

namespace zo {

absl::StatusOr<JobRegistry::Opened> JobRegistry::Open(JobSpec spec) {
  // Creating a job allocates and may preallocate swap files: done under the
  // lock so that two racing opens of one job make one.
  std::lock_guard lock(mu_);
  auto it = jobs_.find(spec.name);
  if (it != jobs_.end()) {
    const std::string mismatch = JobSpecMismatch(it->second->spec(), spec);
    if (!mismatch.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", spec.name, " exists with another description: ", mismatch));
    }
    return Opened{it->second, true};
  }
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<Job> job, Job::Create(std::move(spec), resources_));
  std::shared_ptr<Job> shared = std::move(job);
  jobs_[shared->spec().name] = shared;
  return Opened{shared, false};
}

absl::StatusOr<std::shared_ptr<Job>> JobRegistry::Find(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(name);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job \"", name, "\" on this server"));
  }
  return it->second;
}

absl::StatusOr<v1::CloseJobResponse> JobRegistry::Close(const std::string& name,
                                                        bool delete_checkpoints) {
  std::shared_ptr<Job> job;
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(name);
    if (it == jobs_.end())
      return absl::NotFoundError(absl::StrCat("no job \"", name, "\" on this server"));
    job = std::move(it->second);
    jobs_.erase(it);
  }
  const v1::JobStatus last = job->Status();
  job->Stop();
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
  ZO_LOG(INFO) << "job " << name << " closed at version " << last.version() << removed;
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
