#include "worker/train/staging_ring.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace zo::train {
namespace {

constexpr size_t kAlign = 64;  // Footprint's

}  // namespace

std::shared_ptr<StagingRing> StagingRing::Create(std::shared_ptr<std::byte> memory,
                                                 size_t capacity) {
  return std::shared_ptr<StagingRing>(
      new StagingRing(std::move(memory), capacity / kAlign * kAlign));
}

size_t StagingRing::FindStart(size_t bytes) const {
  if (held_.empty()) return bytes <= capacity_ ? 0 : capacity_;
  const size_t head = held_.back().end;     // where the newest region ends
  const size_t tail = held_.front().start;  // where the oldest begins
  if (head > tail) {
    // Free: [head, capacity_) and [0, tail).
    if (capacity_ - head >= bytes) return head;
    if (tail >= bytes) return 0;
    return capacity_;
  }
  // Wrapped: free is [head, tail) (nothing when head == tail: full).
  return tail - head >= bytes ? head : capacity_;
}

absl::StatusOr<StagingRing::Region> StagingRing::Acquire(size_t bytes) {
  const size_t need = Footprint(bytes);
  if (need > capacity_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a gradient of ", bytes, " bytes is larger than the staging ring's ", capacity_));
  }
  if (need == 0) {  // holds nothing, so it takes no place in the order
    return Region{.data = memory_.get(), .bytes = 0, .owner = shared_from_this()};
  }
  std::unique_lock<std::mutex> lock(mu_);
  size_t start = capacity_;
  freed_.wait(lock, [&] {
    start = FindStart(need);
    return start != capacity_;
  });
  held_.push_back({.start = start, .end = start + need});
  Region r;
  r.data = memory_.get() + start;
  r.bytes = bytes;
  r.owner = std::shared_ptr<const void>(
      r.data, [ring = shared_from_this(), start](const void*) { ring->Release(start); });
  return r;
}

void StagingRing::Release(size_t start) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Held& h : held_) {
    if (h.start == start && !h.released) {
      h.released = true;
      break;
    }
  }
  while (!held_.empty() && held_.front().released) held_.pop_front();
  freed_.notify_all();
}

size_t StagingRing::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t bytes = 0;
  for (const Held& h : held_) bytes += h.end - h.start;
  return bytes;
}

}  // namespace zo::train
