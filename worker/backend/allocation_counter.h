// Bytes of a backend's tensors alive and the most at once
// (Backend::allocation), counted at their storage dtype's size: what a
// device holds for them. Tensors' deleters share it, so a tensor may outlive
// its backend. Thread-safe.
#ifndef ZO_WORKER_BACKEND_ALLOCATION_COUNTER_H_
#define ZO_WORKER_BACKEND_ALLOCATION_COUNTER_H_

#include <atomic>
#include <cstdint>

#include "worker/backend/backend.h"

namespace zo::backend {

class AllocationCounter {
 public:
  void Allocated(int64_t bytes) {
    const int64_t live = live_.fetch_add(bytes) + bytes;
    int64_t peak = peak_.load();
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
  }
  void Freed(int64_t bytes) { live_.fetch_sub(bytes); }

  Backend::Allocation Get() const {
    return {.live_bytes = live_.load(), .peak_bytes = peak_.load()};
  }
  void ResetPeak() { peak_.store(live_.load()); }

 private:
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
};

}  // namespace zo::backend

#endif  // ZO_WORKER_BACKEND_ALLOCATION_COUNTER_H_
