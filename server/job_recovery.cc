// A job's side of a server that restarted without its part of the job: the
// actions its lead's LeadRecovery takes on it (rolling every server back to
// the latest checkpoint, or, with no checkpoint, failing the job in a way
// nobody can mistake for health), and a follower's wait for its lead's
// restore. See docs/architecture.md, "Recovery".
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/job.h"

namespace zo {

RecoveryActions Job::RecoveryActionsForThis() {
  return {
      .ask =
          [this](int server) {
            return resources_.peers
                ->GetJobStatus(spec_.servers[server], spec_.name, absl::Seconds(2))
                .status();
          },
      .roll_back =
          [this](const std::string& path) {
            // LeadRestore opens the part on a follower without it.
            return Restore(path, absl::Now() + absl::Minutes(10), /*rollback=*/true);
          },
      .latest_checkpoint = [this] { return restore_.Latest(); },
      .version = [this] { return position_.version(); },
      .mark_lost = [this](const std::string& what,
                          const absl::Status& why) { MarkLost(what, why); },
      .gave_up = [this] { return position_.gave_up(); },
      .own_part_failed = [this](const absl::Status& why) { position_.OwnPartFailed(why); },
  };
}

void Job::RecoverOwnPart(int64_t followers_version) {
  position_.RecoveringOwnPart(followers_version);
  recovery_.RecoverOwnPart(followers_version);
}

void Job::MarkLost(const std::string& what_happened, const absl::Status& why) {
  const std::string what = absl::StrCat(
      what_happened, ", and no checkpoint can bring it back (", why.message(),
      "): the job is lost. Close it (zo-ctl close --job ", spec_.name,
      ") and train it again, or restore a checkpoint of it kept elsewhere (zo-ctl restore --job ",
      spec_.name, " --checkpoint PATH)");
  if (position_.MarkLost(what)) ZO_LOG(ERROR) << "job " << spec_.name << ": " << what;
}

void Job::LeadLostTheJob(const absl::Status& answer) {
  // Before the first commit the lead may not have created its part yet (the
  // workers open every server at once, and a follower with nothing to wait
  // for reports at once): that is not a loss. JobPosition::LeadLost ignores it.
  position_.LeadLost(answer);
}

void Job::LeadAnswered() { position_.LeadAnswered(); }

void Job::AwaitLeadRestore() { position_.AwaitLeadRestore(); }

bool Job::AwaitingLeadRestore() const { return position_.AwaitingLeadRestore(); }

}  // namespace zo
