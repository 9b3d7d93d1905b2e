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
#ifndef ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_DIR_H_
#define ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_DIR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/sharding.h"
#include "offload/checkpoint/checkpoint_part.h"

namespace zo {

// The commit record, checkpoint.json. Step counters are plain numbers so the
// format needs nothing from the server's types.
struct CheckpointMeta {
  int format_version = 1;
  std::string job;
  int64_t version = 0;        // finished steps (applied or skipped)
  int64_t applied_steps = 0;  // Adam's step count
  // Loss scaler (DeepSpeed's cur_scale, cur_iter, last_overflow_iter, cur_hysteresis).
  double loss_scale = 1.0;
  int64_t scaler_iteration = 0;
  int64_t scaler_last_overflow_iteration = -1;
  int scaler_hysteresis_left = 1;
  // The newest step as JobStatus reports it. Optional in checkpoint.json
  // ("last_step"): older checkpoints lack it and read has_last_step false.
  bool has_last_step = false;
  double last_grad_norm = 0.0;  // NaN: the step's gradients were non-finite
  double last_lr = 0.0;         // of the newest applied step
  // With zo.client_lr, every parameter group's rate of that step (group 0's
  // is last_lr); empty otherwise ("last_step.group_lr", optional).
  std::vector<double> last_group_lr;
  bool last_skipped = false;
  // With a delayed parameter update the step after `version` computes on
  // the version before it, which is kept too (optional in checkpoint.json,
  // "previous"): its number (version - 1), the loss scale it came with, and
  // its weights' type. The parts carry its weights unless they equal the
  // checkpoint's own (the step between was skipped): then `same_data`.
  bool has_previous = false;
  int64_t previous_version = 0;
  double previous_loss_scale = 1.0;
  std::string previous_dtype;  // "fp16", "bf16" or "fp32"
  bool previous_same_data = false;
  std::vector<TensorSpec> manifest;
  int64_t chunk_elems = 0;
  int num_servers = 0;  // part i holds the chunks c with c mod num_servers == i
  int dp_world_size = 0;
  std::string config_json;
  std::vector<CheckpointPartSummary> parts;  // index i: part of server i
  friend bool operator==(const CheckpointMeta&, const CheckpointMeta&) = default;
};

// "step-00000020".
std::string CheckpointDirName(int64_t version);
// "part-00003.zop".
std::string CheckpointPartFileName(int server_index);

// Bytes per element of the previous version in each part of `meta`: 0 when
// the parts carry none.
uint32_t PreviousBytesOf(const CheckpointMeta& meta);

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

// Reads and validates <dir>/checkpoint.json: NOT_FOUND, or DATA_LOSS /
// INVALID_ARGUMENT naming the file and the field.
absl::StatusOr<CheckpointMeta> ReadCheckpointMeta(const std::string& dir);

// A whole committed checkpoint as one flat index space: reads any range of
// master/m/v, whatever chunk and part it falls in. Parts are opened lazily.
// Thread-compatible.
class CheckpointReader {
 public:
  // Reads the meta; the parts are opened on first use.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(const std::string& dir);
  ~CheckpointReader();

  const CheckpointMeta& meta() const;
  int64_t total_elems() const;

  // Elements [flat_begin, flat_begin + n) of the job's flat space into the
  // spans (each empty or of one size n). Errors as CheckpointPartReader::Read;
  // a part whose summary differs from the meta's is DATA_LOSS.
  absl::Status ReadFlat(int64_t flat_begin, absl::Span<float> master, absl::Span<float> m,
                        absl::Span<float> v);
  // Elements [flat_begin, flat_begin + n) of the previous version's weights
  // into `out` (n elements of meta().previous_dtype); FAILED_PRECONDITION
  // when the parts carry none (see CheckpointMeta::has_previous).
  absl::Status ReadPreviousFlat(int64_t flat_begin, int64_t n, void* out);

  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

 private:
  struct Impl;
  explicit CheckpointReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zo

#endif  // ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_DIR_H_
