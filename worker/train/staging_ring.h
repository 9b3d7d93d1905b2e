// Host memory for gradients on their way to the servers, handed out as a
// ring: a stage that streams its weights pushes each gradient as the
// backward makes it, so a few layers' worth in flight is all it needs,
// where a place per parameter would cost a whole copy of the stage
// (18.6 GiB of page-locked memory for 10 B bf16 parameters).
//
//   StagingRing ring(backend.AllocateHost(cap + 63), cap);
//   ZO_ASSIGN_OR_RETURN(StagingRing::Region r, ring.Acquire(bytes));  // may wait
//   ... copy into r.data, hand r.owner to whoever writes it out ...
//   // the region is free once the last copy of r.owner is gone
//
// Regions are handed out in order and come back in any order; the ring's
// free space ends at the oldest region still held. Thread-safe.
#ifndef ZO_WORKER_TRAIN_STAGING_RING_H_
#define ZO_WORKER_TRAIN_STAGING_RING_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "offload/aligned_buffer.h"

namespace zo::train {

class StagingRing : public std::enable_shared_from_this<StagingRing> {
 public:
  // What a region of `bytes` takes in the ring (a multiple of 64).
  static size_t Footprint(size_t bytes) { return RoundUpTo(bytes, 64); }
  // `memory` holds at least `capacity` bytes (kept alive by the ring); the
  // ring uses its first Footprint(capacity) - 64 or more... exactly: the
  // largest multiple of 64 not above `capacity`.
  static std::shared_ptr<StagingRing> Create(std::shared_ptr<std::byte> memory, size_t capacity);

  struct Region {
    std::byte* data = nullptr;
    size_t bytes = 0;
    // Frees the region when its last copy goes; keeps the ring alive.
    std::shared_ptr<const void> owner;
  };
  // A region of `bytes` (rounded up to 64), waiting while the ring is too
  // full. INVALID_ARGUMENT when `bytes` exceeds the capacity.
  absl::StatusOr<Region> Acquire(size_t bytes);

  size_t capacity() const { return capacity_; }
  // Bytes held now (for tests).
  size_t held() const;

 private:
  StagingRing(std::shared_ptr<std::byte> memory, size_t capacity)
      : memory_(std::move(memory)), capacity_(capacity) {}
  // Where a region of `bytes` can start now; capacity_ when nowhere.
  size_t FindStart(size_t bytes) const;
  void Release(size_t start);

  struct Held {
    size_t start = 0;
    size_t end = 0;
    bool released = false;
  };
  const std::shared_ptr<std::byte> memory_;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable freed_;
  std::deque<Held> held_;  // in the order handed out; guarded by mu_
};

}  // namespace zo::train

#endif  // ZO_WORKER_TRAIN_STAGING_RING_H_
