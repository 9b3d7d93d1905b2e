// Helpers for tests that need a checkpoint on disk: a job's whole state as
// three flat arrays of reproducible floats, written the way servers and the
// lead write it (one part per server, then the commit), and byte surgery on
// the files. Used by offload/checkpoint/, server/ and tests/cli/ tests.
#ifndef ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
#define ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/sharding.h"
#include "common/status_macros.h"
#include "offload/checkpoint/checkpoint_dir.h"
#include "offload/checkpoint/checkpoint_part.h"

namespace zo::testing {

// Floats in [-1, 1) that depend on (seed, i); never NaN, so == compares bits.
inline std::vector<float> CheckpointPattern(int64_t n, uint64_t seed) {
  std::vector<float> out(static_cast<size_t>(n));
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL;
  for (float& f : out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    f = static_cast<float>(x >> 40) / static_cast<float>(1 << 23) - 1.0f;
  }
  return out;
}

// A job's optimizer state in flat order.
struct FlatState {
  std::vector<TensorSpec> manifest;
  int64_t chunk_elems = 0;
  int num_servers = 0;
  std::vector<float> master, m, v;
};

inline FlatState MakeFlatState(std::vector<TensorSpec> manifest, int64_t chunk_elems,
                               int num_servers, uint64_t seed) {
  FlatState s{std::move(manifest), chunk_elems, num_servers, {}, {}, {}};
  int64_t total = 0;
  for (const TensorSpec& t : s.manifest) total += NumElements(t.shape);
  s.master = CheckpointPattern(total, seed);
  s.m = CheckpointPattern(total, seed + 1);
  s.v = CheckpointPattern(total, seed + 2);
  return s;
}

// Writes the part of `server` into `dir` (its chunks, ascending).
inline absl::StatusOr<CheckpointPartSummary> WriteTestPart(
    const std::string& dir, const FlatState& s, int server,
    const std::vector<std::byte>* previous = nullptr) {
  ZO_ASSIGN_OR_RETURN(ShardMap map, ShardMap::Create(s.manifest, s.chunk_elems, s.num_servers));
  ZO_ASSIGN_OR_RETURN(auto writer, CheckpointPartWriter::Create(
                                       absl::StrCat(dir, "/", CheckpointPartFileName(server)),
                                       previous != nullptr ? 2 : 0));
  for (int64_t c : map.ChunksOfServer(server)) {
    const FlatRange r = map.ChunkRange(c);
    const size_t b = static_cast<size_t>(r.begin), n = static_cast<size_t>(r.size());
    absl::Span<const std::byte> prev;
    if (previous != nullptr) prev = {previous->data() + 2 * b, 2 * n};
    ZO_RETURN_IF_ERROR(writer->AddChunk(c, r.begin, {s.master.data() + b, n}, {s.m.data() + b, n},
                                        {s.v.data() + b, n}, prev));
  }
  return writer->Finish();
}

inline CheckpointMeta TestMeta(const std::string& job, int64_t version, const FlatState& s) {
  CheckpointMeta meta;
  meta.job = job;
  meta.version = version;
  meta.applied_steps = version > 0 ? version - 1 : 0;
  meta.loss_scale = 32768.0;
  meta.scaler_iteration = version;
  meta.scaler_last_overflow_iteration = version > 0 ? 1 : -1;
  meta.scaler_hysteresis_left = 2;
  meta.manifest = s.manifest;
  meta.chunk_elems = s.chunk_elems;
  meta.num_servers = s.num_servers;
  meta.dp_world_size = 2;
  meta.config_json = R"({"train_batch_size": 8, "fp16": {"enabled": true}})";
  return meta;
}

// Begin, every server's part, commit: the committed directory.
inline absl::StatusOr<std::string> WriteTestCheckpoint(const std::string& root,
                                                       const std::string& job, int64_t version,
                                                       const FlatState& s) {
  ZO_ASSIGN_OR_RETURN(std::string tmp, BeginCheckpoint(root, job, version));
  CheckpointMeta meta = TestMeta(job, version, s);
  for (int server = 0; server < s.num_servers; ++server) {
    ZO_ASSIGN_OR_RETURN(CheckpointPartSummary part, WriteTestPart(tmp, s, server));
    meta.parts.push_back(part);
  }
  return CommitCheckpoint(tmp, meta);
}

// XORs the byte at `offset` of `path` with 0x5a.
inline absl::Status FlipByte(const std::string& path, uint64_t offset) {
  FILE* f = std::fopen(path.c_str(), "r+b");
  if (f == nullptr) return absl::NotFoundError(path);
  absl::Status status = absl::OkStatus();
  int c = EOF;
  if (std::fseek(f, static_cast<long>(offset), SEEK_SET) != 0 || (c = std::fgetc(f)) == EOF ||
      std::fseek(f, static_cast<long>(offset), SEEK_SET) != 0 || std::fputc(c ^ 0x5a, f) == EOF) {
    status = absl::InternalError(absl::StrCat("cannot flip byte ", offset, " of ", path));
  }
  std::fclose(f);
  return status;
}

// An empty directory of this name under the test temp dir.
inline std::string FreshTestDir(const std::string& name) {
  const std::string dir =
      absl::StrCat(std::filesystem::temp_directory_path().string(), "/zo_", name, "_", ::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace zo::testing

#endif  // ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
