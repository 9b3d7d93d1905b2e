// How a server says that a job moved to other servers (zo-ctl rescale), so
// a client can follow it without a restart: a FAILED_PRECONDITION carrying a
// JOB_MOVED v1::ErrorDetail with the new server list and the version the job
// was restored to there. The message says the same for people:
//
//   "job gpt2 moved to servers [10.0.0.3:7070,10.0.0.4:7070] at version 120"
#ifndef ZO_RPC_JOB_MOVE_H_
#define ZO_RPC_JOB_MOVE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace zo {

struct JobMove {
  std::string job;
  std::vector<std::string> servers;  // striping order, the lead first
  int64_t version = 0;               // the job's version there
  friend bool operator==(const JobMove&, const JobMove&) = default;
};

// FAILED_PRECONDITION with the detail and message above.
absl::Status JobMovedError(const JobMove& move);

// The move a status announces (read from its detail, so a prefixed or
// reworded message does not matter); nullopt for every other status.
std::optional<JobMove> ParseJobMove(const absl::Status& status);

}  // namespace zo

#endif  // ZO_RPC_JOB_MOVE_H_
