#include "offload/step_partition.h"

#include <algorithm>

#include "offload/aligned_buffer.h"

namespace zo {

StepPartition::StepPartition(absl::Span<const size_t> chunk_sizes, int workers) {
  workers = std::max(workers, 1);
  std::vector<size_t> chunk_starts(chunk_sizes.size() + 1, 0);
  for (size_t c = 0; c < chunk_sizes.size(); ++c) {
    chunk_starts[c + 1] = chunk_starts[c] + chunk_sizes[c];
  }
  const size_t total = chunk_starts.back();

  // Ideal boundary total*w/workers, moved up to the next line boundary of the
  // chunk it falls in (or that chunk's end). Monotone in w, so pieces never
  // overlap; each piece is within a line of its ideal size.
  piece_bounds_.resize(workers + 1);
  size_t c = 0;
  for (int w = 0; w <= workers; ++w) {
    const size_t ideal = EvenShareBegin(total, workers, w);
    while (c < chunk_sizes.size() && chunk_starts[c + 1] <= ideal) ++c;
    if (ideal == total || c == chunk_sizes.size()) {
      piece_bounds_[w] = ideal;
      continue;
    }
    const size_t offset = RoundUpTo(ideal - chunk_starts[c], kStepAlignElems);
    piece_bounds_[w] = chunk_starts[c] + std::min(offset, chunk_sizes[c]);
  }
  piece_bounds_[workers] = total;

  // Intersect each piece with the chunks it covers.
  segment_bounds_.resize(workers + 1);
  c = 0;
  for (int w = 0; w < workers; ++w) {
    segment_bounds_[w] = segments_.size();
    const size_t begin = piece_bounds_[w];
    const size_t end = piece_bounds_[w + 1];
    while (c < chunk_sizes.size() && chunk_starts[c + 1] <= begin) ++c;
    for (size_t k = c; k < chunk_sizes.size() && chunk_starts[k] < end; ++k) {
      const size_t lo = std::max(begin, chunk_starts[k]);
      const size_t hi = std::min(end, chunk_starts[k + 1]);
      if (lo < hi) segments_.push_back({k, lo - chunk_starts[k], hi - chunk_starts[k]});
    }
  }
  segment_bounds_[workers] = segments_.size();
}

std::vector<Segment> FixedBlocks(absl::Span<const size_t> chunk_sizes, size_t block_elems) {
  std::vector<Segment> blocks;
  for (size_t c = 0; c < chunk_sizes.size(); ++c) {
    for (size_t b = 0; b < chunk_sizes[c]; b += block_elems) {
      blocks.push_back({c, b, std::min(chunk_sizes[c], b + block_elems)});
    }
  }
  return blocks;
}

}  // namespace zo
