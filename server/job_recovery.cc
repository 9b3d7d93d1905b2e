// The lead's side of a follower that restarted without its part of the job:
// noticing it, rolling every server back to the latest checkpoint onto it,
// or, with no checkpoint, failing the job in a way nobody can mistake for
// health. See docs/architecture.md, "Recovery".
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

void Job::RecoverPeer(int server) {
  const std::string& address = spec_.servers[server];
  absl::StatusOr<std::string> latest =
      resources_.checkpoint_root.empty()
          ? absl::NotFoundError("this zo-server was started without --checkpoint-dir")
          : LatestCheckpoint(resources_.checkpoint_root, spec_.name);
  if (absl::IsNotFound(latest.status())) {
    MarkLost(server, latest.status());
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

void Job::MarkLost(int server, const absl::Status& why) {
  std::lock_guard lock(mu_);
  if (lost_ || stop_) return;
  lost_ = true;
  const std::string what = absl::StrCat(
      "server ", server, " (", spec_.servers[server],
      ") restarted and lost its part of the job at version ", version_,
      ", and no checkpoint can bring it back (", why.message(),
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

void Job::AwaitLeadRestore() {
  std::lock_guard lock(mu_);
  awaiting_lead_restore_ = true;
  SetHealthLocked(absl::UnavailableError(absl::StrCat("this server's part waits for the lead (",
                                                      spec_.servers[0], ") to restore it")));
}

bool Job::AwaitingLeadRestore() const {
  std::lock_guard lock(mu_);
  return awaiting_lead_restore_;
}

}  // namespace zo
