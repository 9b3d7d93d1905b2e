// Running totals of one job on this server since it opened, the raw
// material of the metrics endpoint: where step time goes (waiting for
// gradients, the optimizer update, serving pulls) and the bytes moved; and
// the time spent serving pulls since the step log last took it.
// Lock-free, so a scrape never waits on a step.
#ifndef ZO_SERVER_JOB_COUNTERS_H_
#define ZO_SERVER_JOB_COUNTERS_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace zo {

struct JobTotals {
  int64_t steps = 0;           // finished, applied or skipped
  int64_t skipped_steps = 0;   // fp16 overflow
  double wait_seconds = 0;     // from a step's opening until its gradients were complete
  double update_seconds = 0;   // the optimizer step over this server's chunks
  double serve_seconds = 0;    // serving pulls
  int64_t gradient_bytes = 0;  // gradient payload received
  int64_t param_bytes = 0;     // weights sent to pulls
  int64_t pulls = 0;
  // The speculative update: chunks updated before their step was decided,
  // of those kept and not kept (a skipped or clipped step), and the time
  // the updates that replaced them took.
  int64_t speculated_chunks = 0;
  int64_t confirmed_chunks = 0;
  int64_t redone_chunks = 0;
  double redo_seconds = 0;
};

// Thread-safe.
class JobCounters {
 public:
  void AddStep(bool skipped, absl::Duration wait, absl::Duration update) {
    steps_.fetch_add(1, kOrder);
    if (skipped) skipped_.fetch_add(1, kOrder);
    wait_ns_.fetch_add(absl::ToInt64Nanoseconds(wait), kOrder);
    update_ns_.fetch_add(absl::ToInt64Nanoseconds(update), kOrder);
  }
  void AddGradientBytes(int64_t bytes) { gradient_bytes_.fetch_add(bytes, kOrder); }
  void AddSpeculated(int64_t chunks) { speculated_.fetch_add(chunks, kOrder); }
  // A decided step's speculated chunks: kept, or not and replaced in `redo`.
  void AddDecided(int64_t chunks, bool kept, absl::Duration redo) {
    (kept ? confirmed_ : redone_).fetch_add(chunks, kOrder);
    redo_ns_.fetch_add(absl::ToInt64Nanoseconds(redo), kOrder);
  }
  void AddPull(absl::Duration serve, int64_t bytes) {
    pulls_.fetch_add(1, kOrder);
    serve_ns_.fetch_add(absl::ToInt64Nanoseconds(serve), kOrder);
    serve_since_taken_ns_.fetch_add(absl::ToInt64Nanoseconds(serve), kOrder);
    param_bytes_.fetch_add(bytes, kOrder);
  }
  // Serving time of the pulls added since the last call (the step log's).
  absl::Duration TakeRecentServe() {
    return absl::Nanoseconds(serve_since_taken_ns_.exchange(0, kOrder));
  }

  JobTotals Totals() const {
    JobTotals t;
    t.steps = steps_.load(kOrder);
    t.skipped_steps = skipped_.load(kOrder);
    t.wait_seconds = Seconds(wait_ns_);
    t.update_seconds = Seconds(update_ns_);
    t.serve_seconds = Seconds(serve_ns_);
    t.gradient_bytes = gradient_bytes_.load(kOrder);
    t.param_bytes = param_bytes_.load(kOrder);
    t.pulls = pulls_.load(kOrder);
    t.speculated_chunks = speculated_.load(kOrder);
    t.confirmed_chunks = confirmed_.load(kOrder);
    t.redone_chunks = redone_.load(kOrder);
    t.redo_seconds = Seconds(redo_ns_);
    return t;
  }

 private:
  static constexpr std::memory_order kOrder = std::memory_order_relaxed;
  static double Seconds(const std::atomic<int64_t>& ns) {
    return static_cast<double>(ns.load(kOrder)) * 1e-9;
  }

  std::atomic<int64_t> steps_{0};
  std::atomic<int64_t> skipped_{0};
  std::atomic<int64_t> wait_ns_{0};
  std::atomic<int64_t> update_ns_{0};
  std::atomic<int64_t> serve_ns_{0};
  std::atomic<int64_t> serve_since_taken_ns_{0};
  std::atomic<int64_t> gradient_bytes_{0};
  std::atomic<int64_t> param_bytes_{0};
  std::atomic<int64_t> pulls_{0};
  std::atomic<int64_t> speculated_{0};
  std::atomic<int64_t> confirmed_{0};
  std::atomic<int64_t> redone_{0};
  std::atomic<int64_t> redo_ns_{0};
};

}  // namespace zo

#endif  // ZO_SERVER_JOB_COUNTERS_H_
