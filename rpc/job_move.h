// How a server says that a job moved to other servers (zo-ctl rescale), so
// a client can follow it without a restart: a FAILED_PRECONDITION whose
// message carries the new server list and the version the job was restored
// to there, in a form both ends parse the same way.
//
//   "job gpt2 moved to servers [10.0.0.3:7070,10.0.0.4:7070] at version 120"
#ifndef ZO_RPC_JOB_MOVE_H_
#define ZO_RPC_JOB_MOVE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace zo {

struct JobMove {
  std::string job;
  std::vector<std::string> servers;  // striping order, the lead first
  int64_t version = 0;               // the job's version there
  friend bool operator==(const JobMove&, const JobMove&) = default;
};

// FAILED_PRECONDITION with the message above.
absl::Status JobMovedError(const JobMove& move);

// The move a status (or any message that quotes one, e.g. with "server X: "
// before it) announces; nullopt for every other status.
std::optional<JobMove> ParseJobMove(const absl::Status& status);

}  // namespace zo

#endif  // ZO_RPC_JOB_MOVE_H_
