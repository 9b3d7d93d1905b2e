// One server's part of a checkpoint: the fp32 master, m and v of the chunks
// it owns (and, when the job runs a delayed parameter update, the 16-bit
// weights of the version before: what its next step computes on), in one file, written once and
// read back by any number of servers (a checkpoint restores onto a different server count). The
// format is described in offload/checkpoint/design.md.
//
//   ZO_ASSIGN_OR_RETURN(auto writer, CheckpointPartWriter::Create(dir + "/part-00000.zop"));
//   for (chunk : my chunks) ZO_RETURN_IF_ERROR(writer->AddChunk(c, begin, master, m, v));
//   ZO_ASSIGN_OR_RETURN(CheckpointPartSummary summary, writer->Finish());  // fsynced
#ifndef ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_PART_H_
#define ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_PART_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

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

// The same file written out of order: every chunk is known when the part is
// created, so every array has its place, and ranges of it may arrive in any
// order from any number of threads (a snapshot taken while the state keeps
// changing, server/state_snapshot.h). A block one Write covers whole is
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

#endif  // ZO_OFFLOAD_CHECKPOINT_CHECKPOINT_PART_H_
