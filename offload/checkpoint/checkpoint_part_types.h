// What the part writers, the part reader and the commit record
// (checkpoint_dir.h) say about a part: its chunks and its summary.
#ifndef ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_PART_TYPES_H_
#define ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_PART_TYPES_H_

#include <cstdint>
#include <string>

namespace zo {

// Where one chunk sits in the job's flat index space.
struct CheckpointChunk {
  int64_t chunk = 0;
  int64_t flat_begin = 0;
  int64_t elems = 0;
  friend bool operator==(const CheckpointChunk&, const CheckpointChunk&) = default;
};

// What the commit record (checkpoint.json) lists for each part.
struct CheckpointPartSummary {
  std::string file;             // base name inside the checkpoint directory
  int64_t bytes = 0;            // file size
  uint64_t index_checksum = 0;  // XXH3-64 of the part's index (covers every block checksum)
  friend bool operator==(const CheckpointPartSummary&, const CheckpointPartSummary&) = default;
};

}  // namespace zo

#endif  // ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_PART_TYPES_H_
