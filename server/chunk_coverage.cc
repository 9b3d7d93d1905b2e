#include "server/chunk_coverage.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace zo {

ChunkCoverage::ChunkCoverage(int64_t chunk_elems, int dp_world_size)
    : chunk_elems_(chunk_elems), ranges_(dp_world_size), covered_(dp_world_size, 0) {}

absl::StatusOr<std::vector<FlatRange>> ChunkCoverage::Claim(int rank, int64_t begin, int64_t end,
                                                            bool resend) {
  std::map<int64_t, int64_t>& ranges = ranges_[rank];
  // The gaps of [begin, end) between the delivered ranges it overlaps.
  std::vector<FlatRange> gaps;
  int64_t cursor = begin;
  auto it = ranges.upper_bound(begin);
  if (it != ranges.begin() && std::prev(it)->second > begin) --it;
  for (; it != ranges.end() && it->first < end; ++it) {
    if (!resend) {
      return absl::AlreadyExistsError(
          absl::StrCat("elements [", std::max(begin, it->first), ", ", std::min(end, it->second),
                       ") of this chunk were already pushed by dp rank ", rank,
                       " for this step; each element is pushed once per rank per step"));
    }
    if (it->first > cursor) gaps.push_back({cursor, it->first});
    cursor = std::max(cursor, it->second);
  }
  if (cursor < end) gaps.push_back({cursor, end});

  // Insert [begin, end) merged with its neighbours.
  int64_t new_begin = begin;
  int64_t new_end = end;
  auto first = ranges.upper_bound(begin);
  if (first != ranges.begin() && std::prev(first)->second >= begin) --first;
  auto last = first;
  while (last != ranges.end() && last->first <= end) {
    new_begin = std::min(new_begin, last->first);
    new_end = std::max(new_end, last->second);
    ++last;
  }
  ranges.erase(first, last);
  ranges.emplace(new_begin, new_end);

  for (const FlatRange& g : gaps) covered_[rank] += g.size();
  if (covered_[rank] == chunk_elems_ && !gaps.empty()) ++complete_ranks_;
  return gaps;
}

void ChunkCoverage::Reset() {
  for (auto& r : ranges_) r.clear();
  std::fill(covered_.begin(), covered_.end(), 0);
  complete_ranks_ = 0;
}

bool ChunkCoverage::DeliveredAny(int rank, int64_t begin, int64_t end) const {
  const std::map<int64_t, int64_t>& ranges = ranges_[rank];
  auto it = ranges.upper_bound(begin);
  if (it != ranges.begin() && std::prev(it)->second > begin) return true;
  return it != ranges.end() && it->first < end;
}

}  // namespace zo
