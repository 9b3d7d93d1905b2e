#include "worker/client/internal/byte_budget.h"

namespace zo::client_internal {

int64_t ByteBudget::InFlightUpToLocked(int64_t step) const {
  int64_t total = 0;
  for (auto it = bytes_by_step_.begin(); it != bytes_by_step_.end() && it->first <= step; ++it) {
    total += it->second;
  }
  return total;
}

void ByteBudget::Acquire(int64_t step, int64_t bytes) {
  std::unique_lock lock(mu_);
  for (;;) {
    const int64_t used = InFlightUpToLocked(step);
    if (used == 0 || used + bytes <= limit_) break;
    ++times_blocked_;
    released_.wait(lock);
  }
  bytes_by_step_[step] += bytes;
}

void ByteBudget::Release(int64_t step, int64_t bytes) {
  {
    std::lock_guard lock(mu_);
    auto it = bytes_by_step_.find(step);
    if (it == bytes_by_step_.end()) return;  // never acquired: nothing to give back
    it->second -= bytes;
    if (it->second <= 0) bytes_by_step_.erase(it);
  }
  released_.notify_all();
}

int64_t ByteBudget::in_flight() const {
  std::lock_guard lock(mu_);
  int64_t total = 0;
  for (const auto& [step, bytes] : bytes_by_step_) total += bytes;
  return total;
}

int64_t ByteBudget::times_blocked() const {
  std::lock_guard lock(mu_);
  return times_blocked_;
}

}  // namespace zo::client_internal
