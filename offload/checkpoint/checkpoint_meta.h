// The commit record of a checkpoint, checkpoint.json: what it holds, and
// reading and validating it (checkpoint_dir.h writes it at the commit).
#ifndef ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_META_H_
#define ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_META_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/sharding.h"
#include "offload/checkpoint/checkpoint_part_types.h"

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
  // Where the workers set them for that step, every group's betas, eps and
  // weight decay; empty: the job's ("last_step.group_hyper", optional).
  std::vector<ParamGroupConfig> last_group_hyper;
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
  // OpenJobRequest.init_fingerprint of the job that wrote it (what it
  // started from), so that a job adopted from the checkpoint carries it on;
  // 0: none. Optional in checkpoint.json ("init_fingerprint", 16 hex digits).
  uint64_t init_fingerprint = 0;
  std::vector<CheckpointPartSummary> parts;  // index i: part of server i
  friend bool operator==(const CheckpointMeta&, const CheckpointMeta&) = default;
};

// Bytes per element of the previous version in each part of `meta`: 0 when
// the parts carry none.
uint32_t PreviousBytesOf(const CheckpointMeta& meta);

// Reads and validates <dir>/checkpoint.json: NOT_FOUND, or DATA_LOSS /
// INVALID_ARGUMENT naming the file and the field.
absl::StatusOr<CheckpointMeta> ReadCheckpointMeta(const std::string& dir);

namespace checkpoint_internal {

// For checkpoint_dir.cc and checkpoint_reader.cc; callers use the above.

inline constexpr char kMetaFileName[] = "checkpoint.json";

// Job names as the protocol allows them (job.proto): [A-Za-z0-9._-]{1,128},
// which also keeps them a single path component.
absl::Status CheckJobName(const std::string& job);

// 16 hex digits, as checkpoint.json lists index checksums.
std::string ChecksumHex(uint64_t v);

// The text of checkpoint.json for `meta`.
std::string MetaFileText(const CheckpointMeta& meta);

// The part file names and counts of `meta`, and the shard map they imply.
// INVALID_ARGUMENT naming `where` and the field.
absl::StatusOr<ShardMap> ValidateMeta(const CheckpointMeta& meta, const std::string& where);

}  // namespace checkpoint_internal

}  // namespace zo

#endif  // ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_META_H_
