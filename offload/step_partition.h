// How the optimizer step splits a server's chunks across worker threads.
//
// All chunks, in order, form one index space of `total` elements, which is
// cut into one contiguous piece per worker, of nearly equal size whatever the
// chunk sizes: a piece may span several chunks, so no core idles at a
// per-chunk barrier while another finishes a small last chunk. Piece
// boundaries sit on multiples of kStepAlignElems (a 64-byte cache line of
// floats) counted from the start of the chunk they fall in, or on a chunk
// end: two workers never write the same cache line of a line-aligned chunk,
// and SIMD kernels see the same vector/tail split as on the whole chunk.
//
// The partition is a pure function of (chunk sizes, workers), so the pass
// that first touches the memory and every later step agree on who owns what.
#ifndef ZO_OFFLOAD_STEP_PARTITION_H_
#define ZO_OFFLOAD_STEP_PARTITION_H_

#include <cstddef>
#include <vector>

#include "absl/types/span.h"

namespace zo {

inline constexpr size_t kStepAlignElems = 16;

// Elements [begin, end) of chunk `chunk` (begin < end).
struct Segment {
  size_t chunk = 0;
  size_t begin = 0;
  size_t end = 0;

  size_t size() const { return end - begin; }
  friend bool operator==(const Segment&, const Segment&) = default;
};

// Immutable after construction; thread-safe.
class StepPartition {
 public:
  // `chunk_sizes` may contain zeros; `workers` >= 1 (clamped to it).
  StepPartition(absl::Span<const size_t> chunk_sizes, int workers);

  int workers() const { return static_cast<int>(piece_bounds_.size()) - 1; }
  size_t total() const { return piece_bounds_.back(); }

  // Worker w owns the global elements [piece_begin(w), piece_end(w)); empty
  // pieces happen when there are more workers than cache lines.
  size_t piece_begin(int worker) const { return piece_bounds_[worker]; }
  size_t piece_end(int worker) const { return piece_bounds_[worker + 1]; }

  // The same piece as (chunk, range) segments in chunk order.
  absl::Span<const Segment> segments(int worker) const {
    return absl::MakeConstSpan(segments_).subspan(
        segment_bounds_[worker], segment_bounds_[worker + 1] - segment_bounds_[worker]);
  }

 private:
  std::vector<size_t> piece_bounds_;    // workers + 1 global offsets
  std::vector<size_t> segment_bounds_;  // workers + 1 offsets into segments_
  std::vector<Segment> segments_;
};

// Cuts every chunk into blocks of `block_elems` (the last block of a chunk
// may be shorter; empty chunks give none), in chunk order. The blocks do not
// depend on the worker count, which is what makes reductions over them
// reproducible.
std::vector<Segment> FixedBlocks(absl::Span<const size_t> chunk_sizes, size_t block_elems);

// Worker w's share of `count` items: [count*w/workers, count*(w+1)/workers).
inline size_t EvenShareBegin(size_t count, int workers, int w) {
  return static_cast<size_t>(static_cast<unsigned __int128>(count) * w / workers);
}

}  // namespace zo

#endif  // ZO_OFFLOAD_STEP_PARTITION_H_
