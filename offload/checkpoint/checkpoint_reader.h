// A committed checkpoint read back as one flat index space, whatever the
// number of servers that wrote it.
#ifndef ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_READER_H_
#define ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_READER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/sharding.h"
#include "offload/checkpoint/checkpoint_meta.h"
#include "offload/checkpoint/checkpoint_part_reader.h"

namespace zo {

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

namespace checkpoint_internal {

// For CommitCheckpoint (checkpoint_dir.cc), which checks every part the same way.
// Opens part `server` of the checkpoint in `dir` and checks it against the meta.
absl::StatusOr<std::unique_ptr<CheckpointPartReader>> OpenPart(const std::string& dir,
                                                               const CheckpointMeta& meta,
                                                               const ShardMap& map, int server);

}  // namespace checkpoint_internal

}  // namespace zo

#endif  // ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_READER_H_
