// Reads a checkpoint part back, on any server (the format in
// offload/checkpoint/design.md): every block it returns is checked against
// the checksum written for it.
//
//   ZO_ASSIGN_OR_RETURN(auto part, CheckpointPartReader::Open(dir + "/part-00000.zop"));
//   ZO_RETURN_IF_ERROR(part->Read(chunk, offset, master, m, v));
#ifndef ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_PART_READER_H_
#define ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_PART_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "offload/checkpoint/checkpoint_part_types.h"

namespace zo {

// Thread-compatible (const methods may run concurrently: reads use pread).
class CheckpointPartReader {
 public:
  // Opens and validates header, index and trailer: DATA_LOSS naming the
  // path for a truncated file, a bad magic or a checksum mismatch of the
  // index; NOT_FOUND when missing.
  static absl::StatusOr<std::unique_ptr<CheckpointPartReader>> Open(const std::string& path);
  ~CheckpointPartReader();

  const std::vector<CheckpointChunk>& chunks() const;
  // The summary Finish returned when the part was written.
  const CheckpointPartSummary& summary() const;

  // Reads elements [offset, offset + n) of chunk `chunk` into the spans
  // (each either empty or of one size n), verifying the checksum of every
  // block it touches: DATA_LOSS naming path, chunk, array and file offset on
  // a mismatch; NOT_FOUND when the part has no such chunk; OUT_OF_RANGE past
  // the chunk's end.
  absl::Status Read(int64_t chunk, int64_t offset, absl::Span<float> master, absl::Span<float> m,
                    absl::Span<float> v) const;

  // Bytes per element of the previous version's weights; 0 when the part
  // holds none (format 1).
  uint32_t previous_bytes() const;
  // Elements [offset, offset + n) of the previous version into `out`
  // (n * previous_bytes() bytes), checked as Read; FAILED_PRECONDITION when
  // the part holds none.
  absl::Status ReadPrevious(int64_t chunk, int64_t offset, int64_t n, void* out) const;

  CheckpointPartReader(const CheckpointPartReader&) = delete;
  CheckpointPartReader& operator=(const CheckpointPartReader&) = delete;

 private:
  struct Impl;
  explicit CheckpointPartReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zo

#endif  // ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_PART_READER_H_
