// Which elements of one chunk each dp rank has delivered for the open step
// (docs/architecture.md, "Gradients"): every element exactly once per rank per step. A
// piece that overlaps what a rank already delivered is rejected before
// anything is accumulated; a restarted worker re-sending its step may ask for
// the uncovered remainder instead.
#ifndef ZO_SERVER_CHUNK_COVERAGE_H_
#define ZO_SERVER_CHUNK_COVERAGE_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/sharding.h"

namespace zo {

// Not thread-safe; the job serialises access.
class ChunkCoverage {
 public:
  ChunkCoverage(int64_t chunk_elems, int dp_world_size);

  // Marks [begin, end) as delivered by `rank` and returns the ranges to
  // accumulate: the whole piece, or with `resend` only its parts not yet
  // covered. Without `resend`, any overlap is ALREADY_EXISTS naming the
  // overlapping range and nothing is marked. Arguments are checked by the
  // caller (0 <= begin < end <= chunk_elems, rank in range).
  absl::StatusOr<std::vector<FlatRange>> Claim(int rank, int64_t begin, int64_t end, bool resend);

  int64_t covered(int rank) const { return covered_[rank]; }
  // Whether `rank` has delivered any element of [begin, end).
  bool DeliveredAny(int rank, int64_t begin, int64_t end) const;
  // Every rank has delivered every element.
  bool complete() const { return complete_ranks_ == static_cast<int>(ranges_.size()); }
  void Reset();

 private:
  int64_t chunk_elems_;
  // Per rank: begin -> end of disjoint, non-adjacent delivered ranges.
  std::vector<std::map<int64_t, int64_t>> ranges_;
  std::vector<int64_t> covered_;
  int complete_ranks_ = 0;
};

}  // namespace zo

#endif  // ZO_SERVER_CHUNK_COVERAGE_H_
