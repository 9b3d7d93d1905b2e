#include "offload/cpu_optimizer.h"

#include <cstring>
#include <utility>

namespace zo {
namespace {

std::vector<size_t> ChunkSizes(const std::vector<OptimizerChunk>& chunks) {
  std::vector<size_t> sizes;
  sizes.reserve(chunks.size());
  for (const OptimizerChunk& c : chunks) sizes.push_back(c.n);
  return sizes;
}

void ZeroRange(void* base, size_t elem_bytes, size_t begin, size_t end) {
  if (base == nullptr) return;
  std::memset(static_cast<char*>(base) + begin * elem_bytes, 0, (end - begin) * elem_bytes);
}

// Sums in the order given: the caller fixes the order, hence the bits.
void Combine(GradStats& into, const GradStats& part) {
  into.sum_squares += part.sum_squares;
  into.non_finite = into.non_finite || part.non_finite;
}

}  // namespace

CpuOptimizer::CpuOptimizer(ThreadPool* pool, std::vector<OptimizerChunk> chunks)
    : pool_(pool),
      chunks_(std::move(chunks)),
      partition_(ChunkSizes(chunks_), pool->size()),
      stats_blocks_(FixedBlocks(ChunkSizes(chunks_), kStatsBlockElems)) {}

void CpuOptimizer::ForEachSegment(const SegmentFn& fn) const {
  pool_->RunOnAll([&](int worker) {
    for (const Segment& s : partition_.segments(worker)) fn(chunks_[s.chunk], s.begin, s.end);
  });
}

void CpuOptimizer::FirstTouchZero() {
  ForEachSegment([](const OptimizerChunk& c, size_t begin, size_t end) {
    ZeroRange(c.p, sizeof(float), begin, end);
    ZeroRange(c.m, sizeof(float), begin, end);
    ZeroRange(c.v, sizeof(float), begin, end);
    ZeroRange(const_cast<void*>(c.grad.data), DTypeSize(c.grad.dtype), begin, end);
    ZeroRange(c.low_precision.data, DTypeSize(c.low_precision.dtype), begin, end);
  });
}

void CpuOptimizer::AdamStep(const AdamStepConstants& k, SimdLevel level) {
  ForEachSegment([&](const OptimizerChunk& c, size_t begin, size_t end) {
    AdamUpdate(k, OffsetBy(c.grad, begin), c.p + begin, c.m + begin, c.v + begin,
               OffsetBy(c.low_precision, begin), end - begin, level);
  });
}

void CpuOptimizer::AdagradStep(const AdagradStepConstants& k, SimdLevel level) {
  ForEachSegment([&](const OptimizerChunk& c, size_t begin, size_t end) {
    AdagradUpdate(k, OffsetBy(c.grad, begin), c.p + begin, c.m + begin,
                  OffsetBy(c.low_precision, begin), end - begin, level);
  });
}

void CpuOptimizer::LionStep(const LionStepConstants& k, SimdLevel level) {
  ForEachSegment([&](const OptimizerChunk& c, size_t begin, size_t end) {
    LionUpdate(k, OffsetBy(c.grad, begin), c.p + begin, c.m + begin,
               OffsetBy(c.low_precision, begin), end - begin, level);
  });
}

StepGradStats CpuOptimizer::ComputeGradStats(SimdLevel level) const {
  // Each block's result goes to its own slot; workers take contiguous runs of
  // blocks, so only the slots at run edges share a cache line.
  std::vector<GradStats> block_stats(stats_blocks_.size());
  const int workers = pool_->size();
  pool_->RunOnAll([&](int w) {
    const size_t end = EvenShareBegin(stats_blocks_.size(), workers, w + 1);
    for (size_t b = EvenShareBegin(stats_blocks_.size(), workers, w); b < end; ++b) {
      const Segment& s = stats_blocks_[b];
      const OptimizerChunk& c = chunks_[s.chunk];
      block_stats[b] = zo::ComputeGradStats(OffsetBy(c.grad, s.begin), s.size(), level);
    }
  });
  StepGradStats out;
  out.per_chunk.resize(chunks_.size());
  for (size_t b = 0; b < stats_blocks_.size(); ++b) {
    Combine(out.per_chunk[stats_blocks_[b].chunk], block_stats[b]);
  }
  for (const GradStats& s : out.per_chunk) Combine(out.total, s);
  return out;
}

}  // namespace zo
