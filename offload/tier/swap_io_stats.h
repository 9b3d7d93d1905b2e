// Running totals of the NVMe swap's I/O, for metrics and logs: bytes moved,
// requests, and the seconds requests spent between submission and the
// pipeline seeing them complete (the latency a step waits on at worst).
#ifndef ZO_OFFLOAD_TIER_SWAP_IO_STATS_H_
#define ZO_OFFLOAD_TIER_SWAP_IO_STATS_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace zo {

struct SwapIoStats {
  int64_t read_bytes = 0;
  int64_t write_bytes = 0;
  int64_t reads = 0;
  int64_t writes = 0;
  double read_seconds = 0;
  double write_seconds = 0;
};

// Written by the one thread that runs the swap, read from any thread.
class SwapIoCounters {
 public:
  void Record(bool write, int64_t bytes, std::chrono::steady_clock::duration took) {
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(took).count();
    Totals& t = write ? writes_ : reads_;
    t.bytes.fetch_add(bytes, std::memory_order_relaxed);
    t.count.fetch_add(1, std::memory_order_relaxed);
    t.ns.fetch_add(ns, std::memory_order_relaxed);
  }

  SwapIoStats Snapshot() const {
    SwapIoStats s;
    s.read_bytes = reads_.bytes.load(std::memory_order_relaxed);
    s.write_bytes = writes_.bytes.load(std::memory_order_relaxed);
    s.reads = reads_.count.load(std::memory_order_relaxed);
    s.writes = writes_.count.load(std::memory_order_relaxed);
    s.read_seconds = static_cast<double>(reads_.ns.load(std::memory_order_relaxed)) * 1e-9;
    s.write_seconds = static_cast<double>(writes_.ns.load(std::memory_order_relaxed)) * 1e-9;
    return s;
  }

 private:
  struct Totals {
    std::atomic<int64_t> bytes{0};
    std::atomic<int64_t> count{0};
    std::atomic<int64_t> ns{0};
  };
  Totals reads_;
  Totals writes_;
};

}  // namespace zo

#endif  // ZO_OFFLOAD_TIER_SWAP_IO_STATS_H_
