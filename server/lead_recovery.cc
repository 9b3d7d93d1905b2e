#include "server/lead_recovery.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "rpc/error_detail.h"

namespace zo {

LeadRecovery::LeadRecovery(std::string job, std::vector<std::string> servers,
                           RecoveryActions actions)
    : job_(std::move(job)),
      servers_(std::move(servers)),
      actions_(std::move(actions)),
      followers_(servers_) {}

LeadRecovery::~LeadRecovery() { Join(); }

void LeadRecovery::Join() {
  std::lock_guard lock(mu_);
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
}

void LeadRecovery::Probe() {
  for (int i = 1; i < static_cast<int>(servers_.size()); ++i) ProbeOne(i);
}

void LeadRecovery::Heard(int server, const absl::Status& answer) {
  followers_.Record(server, answer);
  if (ReasonOf(answer) != v1::ErrorDetail::NO_JOB) return;
  std::lock_guard lock(mu_);
  if (running_ || absl::ToUnixNanos(absl::Now()) < retry_after_ns_.load() || actions_.gave_up()) {
    return;
  }
  StartLocked([this, server] {
    // The answer may be to a call sent before the last rollback gave the
    // server its part again: ask once more before rolling back.
    const absl::Status now = actions_.ask(server);
    followers_.Record(server, now);
    if (ReasonOf(now) != v1::ErrorDetail::NO_JOB) return;
    const std::string what =
        absl::StrCat("server ", server, " (", servers_[server],
                     ") restarted and lost its part of the job at version ", actions_.version());
    absl::Status failure;
    if (!RollBack(what, absl::StrCat("server ", server, " lost its part"), &failure)) {
      ZO_LOG(ERROR) << "job " << job_ << ": " << what << "; " << failure.message()
                    << " (retried in 10 s)";
      retry_after_ns_ = absl::ToUnixNanos(absl::Now() + absl::Seconds(10));
    }
  });
}

void LeadRecovery::RecoverOwnPart(int64_t followers_version) {
  std::lock_guard lock(mu_);
  StartLocked([this, followers_version] {
    const std::string what =
        absl::StrCat("the lead (", servers_[0],
                     ") restarted and lost its part of the job at version ", followers_version);
    absl::Status failure;
    if (!RollBack(what, "the lead lost its part", &failure)) {
      ZO_LOG(ERROR) << "job " << job_ << ": " << what << "; " << failure.message();
      actions_.own_part_failed(
          absl::Status(failure.code(), absl::StrCat(what, "; ", failure.message())));
    }
  });
}

void LeadRecovery::StartLocked(std::function<void()> work) {
  running_ = true;
  if (thread_.joinable()) thread_.join();
  thread_ = std::thread([this, work = std::move(work)] {
    work();
    running_ = false;
  });
}

bool LeadRecovery::RollBack(const std::string& what_happened, const std::string& after,
                            absl::Status* failure) {
  absl::StatusOr<std::string> latest = actions_.latest_checkpoint();
  if (absl::IsNotFound(latest.status())) {
    actions_.mark_lost(what_happened, latest.status());
    return true;
  }
  if (!latest.ok()) {
    *failure =
        absl::Status(latest.status().code(),
                     absl::StrCat("its checkpoints cannot be listed: ", latest.status().message()));
    return false;
  }
  ZO_LOG(WARNING) << "job " << job_ << ": " << what_happened << "; rolling every server back to "
                  << *latest;
  absl::StatusOr<v1::RestoreResponse> restored = actions_.roll_back(*latest);
  if (!restored.ok()) {
    *failure = absl::Status(restored.status().code(),
                            absl::StrCat("restoring it failed: ", restored.status().message()));
    return false;
  }
  ZO_LOG(WARNING) << "job " << job_ << ": rolled back to version " << restored->version() << " ("
                  << restored->path() << ") after " << after << "; workers resume at step "
                  << restored->version() + 1;
  return true;
}

}  // namespace zo
