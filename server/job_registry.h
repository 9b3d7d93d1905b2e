// The jobs one server hosts, by name. Handlers hold a shared_ptr for the
// length of a call, so closing a job never pulls state from under one.
#ifndef ZO_SERVER_JOB_REGISTRY_H_
#define ZO_SERVER_JOB_REGISTRY_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
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
  // (FAILED_PRECONDITION naming the difference otherwise).
  absl::StatusOr<Opened> Open(JobSpec spec);
  // NOT_FOUND naming the job.
  absl::StatusOr<std::shared_ptr<Job>> Find(const std::string& name) const;
  // Stops the job and frees its state (RAM, swap files) once the calls in
  // flight let go of it. NOT_FOUND naming the job. With
  // `delete_checkpoints`, the lead also removes the job's checkpoints.
  absl::StatusOr<v1::CloseJobResponse> Close(const std::string& name, bool delete_checkpoints);
  std::vector<std::string> Names() const;
  void StopAll();

 private:
  const JobResources resources_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Job>> jobs_;
};

}  // namespace zo

#endif  // ZO_SERVER_JOB_REGISTRY_H_
