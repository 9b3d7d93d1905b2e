// The jobs one server hosts, by name. Handlers hold a shared_ptr for the
// length of a call, so closing a job never pulls state from under one.
#ifndef ZO_SERVER_JOB_REGISTRY_H_
#define ZO_SERVER_JOB_REGISTRY_H_

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/zo/v1/job.pb.h"
#include "rpc/job_move.h"
#include "server/job.h"

namespace zo {

// Thread-safe.
class JobRegistry {
 public:
  explicit JobRegistry(JobResources resources) : resources_(std::move(resources)) {}
  ~JobRegistry() { StopAll(); }

  struct Opened {
    std::shared_ptr<Job> job;
    bool attached = false;
  };
  // Creates the job, or attaches to it when the spec matches
  // (FAILED_PRECONDITION naming the difference otherwise). `attach_only`:
  // never creates; NOT_FOUND (or where the job moved) instead. `by_lead`:
  // the job's lead opens this follower's part to restore it
  // (OpenJobRequest.by_lead); the part then waits for that restore.
  // Otherwise a follower creates its part only after asking the lead: while
  // the lead holds the job trained, or needing a restore, this server
  // restarted and lost its part, and the caller is refused (UNAVAILABLE
  // while the lead rolls the job back onto it, FAILED_PRECONDITION when it
  // cannot); so is a worker attaching to a part that waits for the lead.
  // An `attach_only` caller gets NOT_FOUND there, unless the job needs a
  // restore nobody is doing (NEEDS_RESTORE: it stops waiting). A lead that
  // creates a job its followers hold trained restarted empty: the job is
  // created refusing steps, and rolled back onto it (Job::RecoverOwnPart).
  absl::StatusOr<Opened> Open(JobSpec spec, bool attach_only = false, bool by_lead = false);
  // NOT_FOUND naming the job, or FAILED_PRECONDITION saying where it moved
  // (rpc/job_move.h) when it was closed for a move.
  absl::StatusOr<std::shared_ptr<Job>> Find(const std::string& name) const;
  // Stops the job and frees its state (RAM, swap files) once the calls in
  // flight let go of it. NOT_FOUND naming the job. With
  // `delete_checkpoints`, the lead also removes the job's checkpoints.
  // `moved`, when set, is where the job went: its waiting calls and every
  // later one for it hear so, until a job of that name opens here again.
  absl::StatusOr<v1::CloseJobResponse> Close(const std::string& name, bool delete_checkpoints,
                                             const std::optional<JobMove>& moved = std::nullopt);
  // Opens the job a committed checkpoint holds on `servers` (this server
  // first, the others through PeerClient) and restores it there. On failure
  // whatever it opened is closed again.
  absl::StatusOr<v1::AdoptJobResponse> Adopt(const std::string& checkpoint,
                                             const std::vector<std::string>& servers,
                                             absl::Time deadline);
  std::vector<std::string> Names() const;
  void StopAll();

 private:
  // NOT_FOUND, or where the job moved. Requires mu_.
  absl::Status NotHereLocked(const std::string& name) const;
  // Before a follower creates its part of `spec` for a worker: OK when the
  // lead holds no part of the job or an untrained healthy one; otherwise
  // why not (see Open).
  absl::Status AskLeadBeforeCreating(const JobSpec& spec) const;
  // Before a lead creates `spec`: the highest version its followers hold
  // the job at (0: none holds it trained). UNAVAILABLE when one does not
  // answer: it may hold the job trained, and a job created at version 0
  // beside it would start over.
  absl::StatusOr<int64_t> FollowersVersion(const JobSpec& spec) const;

  const JobResources resources_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Job>> jobs_;
  // Jobs closed for a move, by name: where they went.
  std::map<std::string, JobMove> moved_;
};

}  // namespace zo

#endif  // ZO_SERVER_JOB_REGISTRY_H_
