// The pipelined swap of NVMe-resident sub-groups (docs/architecture.md, "Memory tiers"):
// with `buffers` B >= 3, sub-group k+1 is read while k is updated while k-1
// is written back (with more buffers, reads run further ahead). The update of
// one sub-group runs on every worker of the pool, tile by tile: verify the
// tile's checksums, run the kernel, hash the result; worker 0, which owns the
// engine, feeds it between tiles so the queue stays deep while the cores
// compute. Also the synchronous single-slot reads and writes behind
// LoadMaster / ReadState / WriteState.
//
//   SwapPipeline pipeline(engine.get(), file.get(), buffers.get(), &pool);
//   ZO_RETURN_IF_ERROR(pipeline.Run(&kernel, /*overlap=*/nullptr));
#ifndef ZO_OFFLOAD_TIER_SWAP_PIPELINE_H_
#define ZO_OFFLOAD_TIER_SWAP_PIPELINE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/io/aligned_buffer_pool.h"
#include "offload/io/io_engine.h"
#include "offload/thread_pool.h"
#include "offload/tier/swap_file.h"
#include "offload/tier/swap_io_stats.h"

namespace zo {

// Updates elements [begin, end) of sub-group `sub_group`, whose arrays start
// at p, m and v (element 0 of the sub-group). Called concurrently for
// different tiles.
using TileKernel = std::function<void(int64_t sub_group, int64_t begin, int64_t end, float* p,
                                      float* m, float* v)>;

// Work to overlap with the first reads; it should call `pump` now and then
// from worker 0 (the calling thread) to keep the engine fed.
using OverlapFn = std::function<void(const std::function<void()>& pump)>;

// Thread-compatible: one call at a time, from one thread (the engine's).
// Everything is borrowed and must outlive the pipeline. A call that fails
// has waited for all of its I/O: the engine is idle afterwards unless it
// broke, and the buffers are free.
class SwapPipeline {
 public:
  SwapPipeline(IoEngine* engine, SwapFile* file, AlignedBufferPool* buffers, ThreadPool* pool);

  // Streams every NVMe slot in order: read (or zero-fill a never-written
  // one), verify + kernel + hash per tile, write back. kernel == nullptr is
  // the bare I/O pass: no verification, no hashing (the bytes written back
  // are those read, so the table stays right). `overlap`, if set, runs once
  // after the first reads are queued. The first error (I/O, checksum) ends
  // the run: later sub-groups are left alone and no failed or unverified
  // sub-group is written back. `after_update`, if set, runs on the calling
  // thread once slot k's kernel pass is done (before its write-back).
  absl::Status Run(const TileKernel* kernel, const OverlapFn& overlap,
                   const std::function<void(int64_t slot)>& after_update = nullptr);

  // The slot into `buf` (slot_bytes, aligned), verified when `verify` and
  // checksums are on; a never-written slot is zero-filled.
  absl::Status ReadSlot(int64_t slot, char* buf, bool verify);
  // Hashes `buf` (the whole slot, padding zero) and writes it.
  absl::Status WriteSlot(int64_t slot, char* buf);

  // Every read and write so far, from any thread.
  SwapIoStats io_stats() const { return io_.Snapshot(); }

 private:
  enum class BufState { kFree, kReading, kReady, kWriting };
  struct Buffer {
    BufState state = BufState::kFree;
    int64_t slot = -1;
    bool zero_fill = false;  // never-written slot: zeroed, not read
    std::chrono::steady_clock::time_point submitted;
  };

  // Run's helpers; they record the first error in error_.
  void Fail(absl::Status status);
  void OnCompletion(const IoCompletion& done);
  void Absorb(absl::StatusOr<std::vector<IoCompletion>> done);
  void StartReads();
  void Pump();
  int BufferOf(int64_t slot) const;
  void Process(int buffer, const TileKernel* kernel);
  void Drain();

  // Runs fn(tile) over the slot's tiles on every worker; the first mismatch
  // any of them reports, if any.
  std::optional<ChecksumMismatch> ForTiles(
      int64_t slot, const std::function<std::optional<ChecksumMismatch>(int64_t tile)>& fn,
      bool pump);

  IoEngine* const engine_;
  SwapFile* const file_;
  AlignedBufferPool* const buffers_;
  ThreadPool* const pool_;

  // State of the Run in progress.
  std::vector<Buffer> bufs_;
  int64_t next_read_ = 0;
  absl::Status error_;
  SwapIoCounters io_;
};

}  // namespace zo

#endif  // ZO_OFFLOAD_TIER_SWAP_PIPELINE_H_
