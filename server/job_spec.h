// What a job is, as an OpenJob request describes it, validated: name,
// manifest and sharding, config, data-parallel width, the server list and
// this server's place in it. Two requests describe the same job when their
// specs are equal (the attach rule of docs/architecture.md, "Jobs").
#ifndef ZO_SERVER_JOB_SPEC_H_
#define ZO_SERVER_JOB_SPEC_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/sharding.h"
#include "proto/zo/v1/job.pb.h"
#include "proto/zo/v1/tensor.pb.h"
#include "rpc/proto_convert.h"  // DTypeFromProto, DTypeToProto: job.cc uses them

namespace zo {

// Bounds on what an OpenJob may describe: a caller's message never makes a
// server build more than this many per-tensor records.
inline constexpr int kMaxManifestTensors = 1 << 20;
inline constexpr size_t kMaxTensorNameBytes = 1024;
inline constexpr int kMaxTensorRank = 8;
// Per-chunk records (coverage, locks, pull cursors) are kept for every chunk.
inline constexpr int64_t kMaxJobChunks = int64_t{1} << 22;

struct JobSpec {
  std::string name;
  std::vector<TensorSpec> manifest;
  std::string config_json;
  Config config;
  DType dtype = DType::kFloat16;  // of every tensor: fp16, bf16 or fp32 per the config
  int dp_world_size = 1;
  std::vector<std::string> servers;
  int server_index = 0;
  // OpenJobRequest.init_fingerprint; not part of JobSpecMismatch (a
  // restarted worker's fresh weights differ from a trained job's start).
  uint64_t init_fingerprint = 0;
  std::optional<ShardMap> shard_map;  // over servers.size() servers; always set
};

// Checks an OpenJob request: INVALID_ARGUMENT naming the field for a bad job
// name, an empty manifest, a tensor whose dtype is not the job's, a config
// that does not parse, dp_world_size < 1, an empty or duplicate server list,
// or a server_index outside it; UNIMPLEMENTED for an optimizer the server
// cannot run.
absl::StatusOr<JobSpec> JobSpecFromRequest(const v1::OpenJobRequest& request);

// Empty when `b` may attach to the job `a` describes; otherwise what
// differs, for a FAILED_PRECONDITION message.
std::string JobSpecMismatch(const JobSpec& a, const JobSpec& b);

}  // namespace zo

#endif  // ZO_SERVER_JOB_SPEC_H_
