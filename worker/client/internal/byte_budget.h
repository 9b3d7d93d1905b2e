// Bounds the gradient bytes Push has copied and the sender threads have not
// yet handed to gRPC (ClientOptions::max_bytes_in_flight).
//
// Bytes are counted per step, and a piece of step s waits only on the bytes
// of steps <= s: with the delayed update a server may hold back step s+1's
// pieces until step s is done, so if newer steps could starve older ones, a
// late push of step s would wait on bytes that wait on step s. The bound is
// therefore per overlapping step (two with DPU), not for the whole client.
#ifndef ZO_WORKER_CLIENT_INTERNAL_BYTE_BUDGET_H_
#define ZO_WORKER_CLIENT_INTERNAL_BYTE_BUDGET_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>

namespace zo::client_internal {

// Thread-safe. std::mutex rather than absl::Mutex so that ThreadSanitizer,
// which Debian's Abseil is not built for, sees the ordering.
class ByteBudget {
 public:
  explicit ByteBudget(int64_t limit) : limit_(limit) {}

  // Blocks while the bytes in flight of steps <= `step` plus `bytes` exceed
  // the limit. A single piece larger than the limit passes when nothing of
  // those steps is in flight, so it cannot wait forever.
  void Acquire(int64_t step, int64_t bytes);
  // Returns bytes acquired for `step` (written, or dropped after an error).
  void Release(int64_t step, int64_t bytes);

  int64_t in_flight() const;
  // How many times an Acquire found the budget full and went to sleep; lets
  // a test see a waiter block without sleeping itself.
  int64_t times_blocked() const;

 private:
  int64_t InFlightUpToLocked(int64_t step) const;

  const int64_t limit_;
  mutable std::mutex mu_;
  std::condition_variable released_;
  std::map<int64_t, int64_t> bytes_by_step_;  // guarded by mu_; no zero entries
  int64_t times_blocked_ = 0;                 // guarded by mu_
};

}  // namespace zo::client_internal

#endif  // ZO_WORKER_CLIENT_INTERNAL_BYTE_BUDGET_H_
