// A set of element ranges [begin, end), kept merged: what a pass has
// covered so far (ranges a restore rewrote, tiles an update has kept).
//
//   RangeSet done;
//   done.Add(0, 16);
//   done.Add(16, 32);
//   done.Contains(8, 24);  // true: [0, 32) is one range
//
// Not thread-safe.
#ifndef ZO_COMMON_RANGE_SET_H_
#define ZO_COMMON_RANGE_SET_H_

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>

namespace zo {

class RangeSet {
 public:
  // Adds [begin, end), merging it with the ranges it overlaps or touches.
  void Add(int64_t begin, int64_t end) {
    if (begin >= end) return;
    auto it = ranges_.upper_bound(begin);
    if (it != ranges_.begin() && std::prev(it)->second >= begin) {
      --it;
      begin = it->first;
      end = std::max(end, it->second);
      size_ -= it->second - it->first;
      it = ranges_.erase(it);
    }
    while (it != ranges_.end() && it->first <= end) {
      end = std::max(end, it->second);
      size_ -= it->second - it->first;
      it = ranges_.erase(it);
    }
    ranges_.emplace(begin, end);
    size_ += end - begin;
  }

  // Whether every element of [begin, end) is in the set (true when empty).
  bool Contains(int64_t begin, int64_t end) const {
    if (begin >= end) return true;
    auto after = ranges_.upper_bound(begin);
    return after != ranges_.begin() && std::prev(after)->second >= end;
  }

  // Whether any element of [begin, end) is in the set (false when empty).
  bool Overlaps(int64_t begin, int64_t end) const {
    if (begin >= end) return false;
    auto after = ranges_.lower_bound(end);  // the first range starting at or past end
    return after != ranges_.begin() && std::prev(after)->second > begin;
  }

  // Calls f(b, e) for each part [b, e) of [begin, end) in the set, in order.
  template <typename F>
  void ForEachIn(int64_t begin, int64_t end, F f) const {
    if (begin >= end) return;
    auto it = ranges_.upper_bound(begin);
    if (it != ranges_.begin()) --it;
    for (; it != ranges_.end() && it->first < end; ++it) {
      const int64_t b = std::max(begin, it->first), e = std::min(end, it->second);
      if (b < e) f(b, e);
    }
  }

  // Elements in the set.
  int64_t size() const { return size_; }
  void Clear() {
    ranges_.clear();
    size_ = 0;
  }

 private:
  std::map<int64_t, int64_t> ranges_;  // begin -> end, disjoint and non-adjacent
  int64_t size_ = 0;
};

}  // namespace zo

#endif  // ZO_COMMON_RANGE_SET_H_
