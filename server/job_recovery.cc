// The lead's side of a server that restarted without its part of the job
// (a follower, or the lead itself): noticing it, rolling every server back
// to the latest checkpoint, or, with no checkpoint, failing the job in a way
// nobody can mistake for health. See docs/architecture.md, "Recovery".
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "offload/checkpoint/checkpoint_dir.h"
#include "rpc/error_detail.h"
#include "rpc/proto_convert.h"
#include "server/job.h"

namespace zo {

void Job::ProbeFollowers() {
  for (int i = 1; i < static_cast<int>(spec_.servers.size()); ++i) {
    MaybeRecover(
        i, resources_.peers->GetJobStatus(spec_.servers[i], spec_.name, absl::Seconds(2)).status());
  }
}

void Job::MaybeRecover(int server, const absl::Status& answer) {
  if (!is_lead()) return;
  followers_.Record(server, answer);
  if (ReasonOf(answer) != v1::ErrorDetail::NO_JOB) return;
  std::lock_guard lock(recovery_mu_);
  if (recovering_ || absl::Now() - last_recovery_ < absl::Seconds(10)) return;
  {
    std::lock_guard state(mu_);
    if (stop_ || lost_) return;
  }
  last_recovery_ = absl::Now();
  recovering_ = true;
  if (recovery_.joinable()) recovery_.join();
  recovery_ = std::thread([this, server] {
    RecoverPeer(server);
    recovering_ = false;
  });
}

absl::StatusOr<std::string> Job::LatestCheckpointHere() const {
  if (resources_.checkpoint_root.empty()) {
    return absl::NotFoundError("this zo-server was started without --checkpoint-dir");
  }
  return LatestCheckpoint(resources_.checkpoint_root, spec_.name);
}

void Job::RecoverPeer(int server) {
  const std::string& address = spec_.servers[server];
  absl::StatusOr<std::string> latest = LatestCheckpointHere();
  if (absl::IsNotFound(latest.status())) {
    int64_t version;
    {
      std::lock_guard lock(mu_);
      version = version_;
    }
    MarkLost(absl::StrCat("server ", server, " (", address,
                          ") restarted and lost its part of the job at version ", version),
             latest.status());
    return;
  }
  if (!latest.ok()) {
    ZO_LOG(ERROR) << "job " << spec_.name << ": server " << server << " (" << address
                  << ") lost its part of the job, and its checkpoints cannot be listed: "
                  << latest.status() << " (retried in 10 s)";
    return;
  }
  ZO_LOG(WARNING) << "job " << spec_.name << ": server " << server << " (" << address
                  << ") lost its part of the job (it restarted); rolling every server back to "
                  << *latest;
  // Restore opens the part on the follower again (OpenPartOn).
  absl::StatusOr<v1::RestoreResponse> restored =
      Restore(*latest, absl::Now() + absl::Minutes(10), /*rollback=*/true);
  if (!restored.ok()) {
    ZO_LOG(ERROR) << "job " << spec_.name << ": rolling back after losing server " << server
                  << " failed: " << restored.status() << " (retried in 10 s)";
    return;
  }
  ZO_LOG(WARNING) << "job " << spec_.name << ": rolled back to version " << restored->version()
                  << " (" << restored->path() << ") after server " << server
                  << " lost its part; workers resume at step " << restored->version() + 1;
}

void Job::RecoverOwnPart(int64_t followers_version) {
  {
    std::lock_guard lock(mu_);
    SetHealthLocked(absl::UnavailableError(absl::StrCat(
        "this lead restarted without its part of the job, which its followers hold at version ",
        followers_version, ": restoring the latest checkpoint")));
  }
  std::lock_guard lock(recovery_mu_);
  last_recovery_ = absl::Now();
  recovering_ = true;
  if (recovery_.joinable()) recovery_.join();
  recovery_ = std::thread([this, followers_version] {
    const std::string what =
        absl::StrCat("the lead (", spec_.servers[0],
                     ") restarted and lost its part of the job at version ", followers_version);
    absl::StatusOr<std::string> latest = LatestCheckpointHere();
    if (absl::IsNotFound(latest.status())) {
      MarkLost(what, latest.status());
    } else if (!latest.ok()) {
      std::lock_guard state(mu_);
      SetHealthLocked(absl::FailedPreconditionError(
          absl::StrCat(what, "; its checkpoints cannot be listed: ", latest.status().message())));
    } else {
      ZO_LOG(WARNING) << "job " << spec_.name << ": " << what << "; rolling every server back to "
                      << *latest;
      absl::StatusOr<v1::RestoreResponse> restored =
          Restore(*latest, absl::Now() + absl::Minutes(10), /*rollback=*/true);
      if (restored.ok()) {
        ZO_LOG(WARNING) << "job " << spec_.name << ": rolled back to version "
                        << restored->version() << "; workers resume at step "
                        << restored->version() + 1;
      } else {
        ZO_LOG(ERROR) << "job " << spec_.name << ": " << what
                      << "; restoring it failed: " << restored.status();
        std::lock_guard state(mu_);
        if (health_.code() == absl::StatusCode::kUnavailable) {
          SetHealthLocked(absl::FailedPreconditionError(
              absl::StrCat(what, "; restoring it failed: ", restored.status().message())));
        }
      }
    }
    recovering_ = false;
  });
}

void Job::MarkLost(const std::string& what_happened, const absl::Status& why) {
  std::lock_guard lock(mu_);
  if (lost_ || stop_) return;
  lost_ = true;
  const std::string what = absl::StrCat(
      what_happened, ", and no checkpoint can bring it back (", why.message(),
      "): the job is lost. Close it (zo-ctl close --job ", spec_.name,
      ") and train it again, or restore a checkpoint of it kept elsewhere (zo-ctl restore --job ",
      spec_.name, " --checkpoint PATH)");
  ZO_LOG(ERROR) << "job " << spec_.name << ": " << what;
  SetHealthLocked(absl::DataLossError(what));
}

absl::Status Job::OpenPartOn(int server) {
  v1::OpenJobRequest request;
  request.set_job(spec_.name);
  *request.mutable_manifest() = ManifestToProto(spec_.manifest);
  request.set_config_json(spec_.config_json);
  request.set_dp_world_size(spec_.dp_world_size);
  for (const std::string& s : spec_.servers) request.add_servers(s);
  request.set_server_index(server);
  request.set_init_fingerprint(spec_.init_fingerprint);
  request.set_by_lead(true);
  return resources_.peers->OpenJob(spec_.servers[server], request, absl::Seconds(5)).status();
}

void Job::LeadLostTheJob(const absl::Status& answer) {
  std::lock_guard lock(mu_);
  // Before the first commit the lead may not have created its part yet (the
  // workers open every server at once, and a follower with nothing to wait
  // for reports at once): that is not a loss.
  if (!health_.ok() || stop_ || version_ == 0) return;
  lead_restore_wait_ = LeadRestoreWait::kLeadLostTheJob;
  ZO_LOG(WARNING) << "job " << spec_.name << ": the lead (" << spec_.servers[0]
                  << ") no longer holds the job (" << answer.message()
                  << "); waiting for it to roll the job back";
  SetHealthLocked(absl::UnavailableError(
      absl::StrCat("the lead (", spec_.servers[0],
                   ") restarted without the job; waiting for it to roll the job back (a worker "
                   "that opens the job there starts that)")));
}

void Job::LeadAnswered() {
  // Every report of every step comes here: no lock unless there is news.
  if (lead_restore_wait_.load() != LeadRestoreWait::kLeadLostTheJob) return;
  std::lock_guard lock(mu_);
  if (lead_restore_wait_ != LeadRestoreWait::kLeadLostTheJob) return;
  lead_restore_wait_ = LeadRestoreWait::kNone;
  if (health_.code() == absl::StatusCode::kUnavailable && !restoring_) {
    SetHealthLocked(absl::OkStatus());
  }
}

void Job::AwaitLeadRestore() {
  std::lock_guard lock(mu_);
  lead_restore_wait_ = LeadRestoreWait::kOpenedByLead;
  SetHealthLocked(absl::UnavailableError(absl::StrCat("this server's part waits for the lead (",
                                                      spec_.servers[0], ") to restore it")));
}

bool Job::AwaitingLeadRestore() const {
  return lead_restore_wait_.load() == LeadRestoreWait::kOpenedByLead;
}

}  // namespace zo
