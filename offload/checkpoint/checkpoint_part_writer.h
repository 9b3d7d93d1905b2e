// Writes a checkpoint part in order, one chunk after the other (the format
// in offload/checkpoint/design.md).
//
//   ZO_ASSIGN_OR_RETURN(auto writer, CheckpointPartWriter::Create(dir + "/part-00000.zop"));
//   for (chunk : my chunks) ZO_RETURN_IF_ERROR(writer->AddChunk(c, begin, master, m, v));
//   ZO_ASSIGN_OR_RETURN(CheckpointPartSummary summary, writer->Finish());  // fsynced
#ifndef ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_PART_WRITER_H_
#define ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_PART_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "offload/checkpoint/checkpoint_part_types.h"

namespace zo {

// Not thread-safe. Writes with plain buffered I/O (checkpoints are rare and
// sequential); Finish fsyncs the file. Destroying an unfinished writer
// removes the file.
class CheckpointPartWriter {
 public:
  // Creates `path`; ALREADY_EXISTS when it exists, the errno's status
  // (RESOURCE_EXHAUSTED for a full disk) naming the path otherwise.
  // `previous_bytes` > 0: every chunk also carries the previous version's
  // weights, elements of that many bytes.
  static absl::StatusOr<std::unique_ptr<CheckpointPartWriter>> Create(const std::string& path,
                                                                      uint32_t previous_bytes = 0);
  ~CheckpointPartWriter();

  // Appends one chunk; master, m and v have the same size (> 0), `previous`
  // previous_bytes per element. Chunks are added in ascending chunk order,
  // each once.
  absl::Status AddChunk(int64_t chunk, int64_t flat_begin, absl::Span<const float> master,
                        absl::Span<const float> m, absl::Span<const float> v,
                        absl::Span<const std::byte> previous = {});

  // Writes the index and trailer, fsyncs and closes.
  absl::StatusOr<CheckpointPartSummary> Finish();

  CheckpointPartWriter(const CheckpointPartWriter&) = delete;
  CheckpointPartWriter& operator=(const CheckpointPartWriter&) = delete;

 private:
  struct Impl;
  explicit CheckpointPartWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zo

#endif  // ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_PART_WRITER_H_
