// A checkpoint on disk: a directory per version under <root>/<job>/, written
// under a temporary name by every server and committed by the lead server
// only when all parts are there (docs/architecture.md, "Failure, bad input, security").
//
//   <root>/<job>/step-00000020.tmp/part-00000.zop, part-00001.zop   (servers)
//   <root>/<job>/step-00000020.tmp/checkpoint.json                  (lead, last)
//   rename -> <root>/<job>/step-00000020/, fsync <root>/<job>/       (commit)
//
// A directory without a readable checkpoint.json, or still named *.tmp, is
// not a checkpoint. The root must be one filesystem that every server of the
// job sees (a shared mount when servers run on several hosts).
//
// This header is the directory protocol; it includes what goes with it:
// checkpoint_meta.h (checkpoint.json), checkpoint_reader.h (a committed
// checkpoint read as one flat index space) and checkpoint_part.h (the parts).
#ifndef ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_DIR_H_
#define ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_DIR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/checkpoint/checkpoint_meta.h"
#include "offload/checkpoint/checkpoint_part.h"
#include "offload/checkpoint/checkpoint_reader.h"

namespace zo {

// "step-00000020".
std::string CheckpointDirName(int64_t version);
// "part-00003.zop".
std::string CheckpointPartFileName(int server_index);

// Creates <root>/<job>/step-<version>.tmp (parents as needed), removing
// every temporary directory of the job left by earlier failed or
// interrupted attempts (one checkpoint of a job is written at a time);
// returns its path.
absl::StatusOr<std::string> BeginCheckpoint(const std::string& root, const std::string& job,
                                            int64_t version);

// Removes the temporary directory of a checkpoint that failed (a path
// BeginCheckpoint returned; anything not named *.tmp is refused).
absl::Status AbandonCheckpoint(const std::string& tmp_dir);

// Writes checkpoint.json into `tmp_dir` (temp name, fsync, rename), checks
// that every listed part exists with its size and index checksum, renames
// the directory to its final name and fsyncs the parent. Returns the final
// path. Leaves tmp_dir in place on error.
absl::StatusOr<std::string> CommitCheckpoint(const std::string& tmp_dir,
                                             const CheckpointMeta& meta);

// The committed checkpoint of `job` with the highest version under `root`,
// or NOT_FOUND naming the directory searched.
absl::StatusOr<std::string> LatestCheckpoint(const std::string& root, const std::string& job);

// Removes the committed checkpoints of `job` under `root` beyond the `keep`
// newest (keep >= 1); temporary directories stay. Returns the paths removed.
absl::StatusOr<std::vector<std::string>> PruneCheckpoints(const std::string& root,
                                                          const std::string& job, int keep);

// Removes <root>/<job> and everything in it (committed and temporary
// checkpoints); returns the checkpoint directories that were there. An
// absent directory removes nothing.
absl::StatusOr<std::vector<std::string>> RemoveJobCheckpoints(const std::string& root,
                                                              const std::string& job);

}  // namespace zo

#endif  // ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_DIR_H_
