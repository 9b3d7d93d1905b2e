// The threaded CPU optimizer step over all chunks a server holds.
//
// Each worker of a ThreadPool owns one contiguous piece of the chunks'
// combined index space (offload/step_partition.h) and runs the fused kernel
// (offload/optimizer_kernels.h) over the segments of its piece: one wake-up
// and one barrier per step, every core busy to the end, and the same
// ownership for the first-touch pass, so each core updates memory on its own
// NUMA node.
//
//   ThreadPool pool;
//   CpuOptimizer opt(&pool, chunks);   // chunk arrays from AlignedBuffer
//   opt.FirstTouchZero();              // once, before loading the master weights
//   ...
//   opt.AdamStep(MakeAdamStepConstants(hp, step, grad_scale));
#ifndef ZO_OFFLOAD_CPU_OPTIMIZER_H_
#define ZO_OFFLOAD_CPU_OPTIMIZER_H_

#include <cstddef>
#include <functional>
#include <optional>
#include <vector>

#include "common/cpu_features.h"
#include "offload/optimizer_kernels.h"
#include "offload/step_partition.h"
#include "offload/thread_pool.h"

namespace zo {

// One chunk's arrays, all of n elements, borrowed. Which state arrays a
// kernel uses: Adam p, m, v; Lion p, m; Adagrad p and m (the running sum of
// squared gradients). Unused pointers may be null.
struct OptimizerChunk {
  float* p = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  TypedConstPtr grad;      // what the kernel reads, usually the fp32 accumulator
  TypedPtr low_precision;  // the copy served to pulls; data == nullptr: not written
  size_t n = 0;
};

// Elements per block of the statistics pass: a fixed unit, independent of
// the worker count, so that the result is reproducible.
inline constexpr size_t kStatsBlockElems = size_t{64} << 10;

// Gradient statistics of a whole step.
struct StepGradStats {
  GradStats total;                   // combined chunk by chunk, in chunk order
  std::vector<GradStats> per_chunk;  // each combined block by block, in order
};

// Thread-compatible: one call at a time (the pool would serialize concurrent
// calls anyway). The pool and every chunk array are borrowed and must outlive
// this object; chunk arrays must not overlap.
class CpuOptimizer {
 public:
  CpuOptimizer(ThreadPool* pool, std::vector<OptimizerChunk> chunks);

  CpuOptimizer(const CpuOptimizer&) = delete;
  CpuOptimizer& operator=(const CpuOptimizer&) = delete;

  const std::vector<OptimizerChunk>& chunks() const { return chunks_; }
  const StepPartition& partition() const { return partition_; }
  int workers() const { return partition_.workers(); }

  // Zeroes every non-null array of every chunk (p, m, v, grad, low-precision
  // copy), each worker its own piece. Call once on freshly mapped memory
  // (AlignedBuffer) so the pages land on the node of the core that updates
  // them.
  void FirstTouchZero();

  // One optimizer step over all chunks, at the host's SIMD level or a given
  // one (which must be supported).
  void AdamStep(const AdamStepConstants& c) { AdamStep(c, ActiveSimdLevel()); }
  void AdamStep(const AdamStepConstants& c, SimdLevel level);
  void AdagradStep(const AdagradStepConstants& c) { AdagradStep(c, ActiveSimdLevel()); }
  void AdagradStep(const AdagradStepConstants& c, SimdLevel level);
  void LionStep(const LionStepConstants& c) { LionStep(c, ActiveSimdLevel()); }
  void LionStep(const LionStepConstants& c, SimdLevel level);

  // Where the statistics read chunk `chunk`'s gradients [begin, begin + n),
  // one kStatsBlockElems block from the chunk's start: for a caller whose
  // gradients are not all in `grad` (a server's accumulator reads them
  // through its GradientSource). Unset: the chunk's `grad`.
  using GradBlockReader = std::function<TypedConstPtr(size_t chunk, size_t begin, size_t n)>;

  // Sum of squares and non-finite flag of every chunk's gradients, threaded.
  // Bit-identical for any worker count: blocks of kStatsBlockElems are
  // reduced independently and combined in order.
  StepGradStats ComputeGradStats(const GradBlockReader& read = {}) const {
    return ComputeGradStats(ActiveSimdLevel(), read);
  }
  StepGradStats ComputeGradStats(SimdLevel level, const GradBlockReader& read = {}) const;
  // The same where some chunks' statistics are known already (a chunk's are
  // final once its gradients are: the server's speculative update takes
  // them as each chunk fills): known[c], where set, is used as chunk c's
  // and the rest are read. Bit for bit ComputeGradStats when each known
  // entry is what ComputeChunkGradStats gave for that chunk. known has one
  // entry per chunk.
  StepGradStats ComputeGradStats(const std::vector<std::optional<GradStats>>& known,
                                 const GradBlockReader& read = {}) const;
  // The statistics of chunks `which` alone (indices, any order), each as
  // ComputeGradStats gives it, threaded: with `max_workers` > 0 on only the
  // first that many workers (the rest leave their cores to other work).
  std::vector<GradStats> ComputeChunkGradStats(const std::vector<int>& which, int max_workers = 0,
                                               const GradBlockReader& read = {}) const;

  // The driver behind every step: fn(chunk, begin, end) for each segment of
  // each worker's piece, on that worker, in order; returns when all are done.
  using SegmentFn = std::function<void(const OptimizerChunk& chunk, size_t begin, size_t end)>;
  void ForEachSegment(const SegmentFn& fn) const;

 private:
  ThreadPool* const pool_;
  const std::vector<OptimizerChunk> chunks_;
  const StepPartition partition_;
  const std::vector<Segment> stats_blocks_;

  // Each chunk's statistics, reading only the blocks of chunks whose
  // `wanted` entry is true (the others stay zero).
  std::vector<GradStats> PerChunkStats(const std::vector<bool>& wanted, SimdLevel level,
                                       int max_workers, const GradBlockReader& read) const;
};

// `ptr` advanced by `elems` elements of its dtype.
inline TypedConstPtr OffsetBy(TypedConstPtr ptr, size_t elems) {
  return {static_cast<const char*>(ptr.data) + elems * DTypeSize(ptr.dtype), ptr.dtype};
}
inline TypedPtr OffsetBy(TypedPtr ptr, size_t elems) {
  if (ptr.data == nullptr) return ptr;
  return {static_cast<char*>(ptr.data) + elems * DTypeSize(ptr.dtype), ptr.dtype};
}

}  // namespace zo

#endif  // ZO_OFFLOAD_CPU_OPTIMIZER_H_
