// What a server checks of its directories before it listens, so a bad flag
// fails at startup with the flag's name instead of at the first checkpoint
// or the first NVMe step, minutes into a job.
#ifndef ZO_SERVER_STARTUP_CHECKS_H_
#define ZO_SERVER_STARTUP_CHECKS_H_

#include <string>

#include "absl/status/status.h"

namespace zo {

// --checkpoint-dir: created (with its parents) when missing; a probe file
// is written, fsynced and removed. FAILED_PRECONDITION naming `flag`, the
// path and why otherwise. A full disk (ENOSPC, EDQUOT) is not refused but
// logged: a server restarted under a job must come up for the lead to roll
// it back (a restore only reads), and checkpoints fail loudly until there
// is room again, as they do for a running server.
absl::Status CheckCheckpointDir(const std::string& dir, const std::string& flag);

// --nvme-path: created when missing, and able to do O_DIRECT reads and
// writes (CheckDirectIo). FAILED_PRECONDITION naming `flag` otherwise.
absl::Status CheckNvmeDir(const std::string& dir, const std::string& flag);

}  // namespace zo

#endif  // ZO_SERVER_STARTUP_CHECKS_H_
