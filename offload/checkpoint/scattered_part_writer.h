#ifndef ZO_OFFLOAD_CHECKPOINT_SCATTERED_PART_WRITER_H_
#define ZO_OFFLOAD_CHECKPOINT_SCATTERED_PART_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "offload/checkpoint/checkpoint_part_types.h"

namespace zo {

// A checkpoint part (the file checkpoint_part_writer.h writes) written out
// of order: every chunk is known when the part is created, so every array
// has its place, and ranges of it may arrive in any order from any number
// of threads (a snapshot taken while the state keeps changing,
// server/state_snapshot.h). A block one Write covers whole is
// hashed from that write's memory; Finish reads back the others to hash
// them, writes the index and trailer and fsyncs: the file is byte for byte what
// CheckpointPartWriter makes of the same chunks and values.
//
//   ZO_ASSIGN_OR_RETURN(auto w, ScatteredPartWriter::Create(path, chunks));
//   // on any threads, each range once:
//   ZO_RETURN_IF_ERROR(w->Write(i, offset, n, master, m, v));
//   ZO_ASSIGN_OR_RETURN(CheckpointPartSummary summary, w->Finish());
//
// Write is thread-safe; Create and Finish are not. Destroying an unfinished
// writer removes the file.
class ScatteredPartWriter {
 public:
  // `chunks` in ascending chunk id, each with elems > 0; `previous_bytes`
  // as for CheckpointPartWriter. The file is sized now (sparse): padding
  // reads as zeros.
  static absl::StatusOr<std::unique_ptr<ScatteredPartWriter>> Create(
      const std::string& path, std::vector<CheckpointChunk> chunks, uint32_t previous_bytes = 0);
  ~ScatteredPartWriter();

  const std::vector<CheckpointChunk>& chunks() const;
  const std::string& path() const;
  uint32_t previous_bytes() const;

  // Elements [offset, offset + n) of chunks()[index]; each pointer holds n
  // floats. The first failure is sticky and returned by later calls.
  absl::Status Write(size_t index, int64_t offset, int64_t n, const float* master, const float* m,
                     const float* v);
  // The same elements of the previous version: n * previous_bytes() bytes.
  // `direct`: as WriteRun (waits for the disk where it can go around the
  // page cache).
  absl::Status WritePrevious(size_t index, int64_t offset, int64_t n, const void* data,
                             bool direct = false);

  // Ranges that follow each other in chunks()[index] from `offset` on, each
  // from buffers of its own: one system call per array, and where the file
  // offsets, lengths and buffers are 4 KiB-aligned (and the filesystem
  // allows it) straight to the disk with O_DIRECT, costing no page-cache
  // copy and no writeback later. So the caller waits for the disk: this is
  // for a background writer, not a step.
  struct Piece {
    int64_t n = 0;
    const float* master = nullptr;
    const float* m = nullptr;
    const float* v = nullptr;
  };
  absl::Status WriteRun(size_t index, int64_t offset, absl::Span<const Piece> pieces);
  // Whether WriteRun can go around the page cache here (tmpfs cannot).
  bool writes_direct() const;

  // Every element must have been written (the caller tracks that; a range
  // never written reads as zeros).
  absl::StatusOr<CheckpointPartSummary> Finish();

  ScatteredPartWriter(const ScatteredPartWriter&) = delete;
  ScatteredPartWriter& operator=(const ScatteredPartWriter&) = delete;

 private:
  struct Impl;
  explicit ScatteredPartWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zo

#endif  // ZO_OFFLOAD_CHECKPOINT_SCATTERED_PART_WRITER_H_
