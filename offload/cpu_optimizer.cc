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

std::vector<GradStats> CpuOptimizer::PerChunkStats(const std::vector<bool>& wanted, SimdLevel level,
                                                   int max_workers,
                                                   const GradBlockReader& read) const {
  std::vector<size_t> blocks;
  for (size_t b = 0; b < stats_blocks_.size(); ++b) {
    if (wanted[stats_blocks_[b].chunk]) blocks.push_back(b);
  }
  // Each block's result goes to its own slot; workers take contiguous runs of
  // blocks, so only the slots at run edges share a cache line.
  std::vector<GradStats> block_stats(blocks.size());
  const int workers = max_workers > 0 ? std::min(max_workers, pool_->size()) : pool_->size();
  pool_->RunOnAll([&](int w) {
    if (w >= workers) return;
    const size_t end = EvenShareBegin(blocks.size(), workers, w + 1);
    for (size_t i = EvenShareBegin(blocks.size(), workers, w); i < end; ++i) {
      const Segment& s = stats_blocks_[blocks[i]];
      const TypedConstPtr grad =
          read ? read(s.chunk, s.begin, s.size()) : OffsetBy(chunks_[s.chunk].grad, s.begin);
      block_stats[i] = zo::ComputeGradStats(grad, s.size(), level);
    }
  });
  std::vector<GradStats> per_chunk(chunks_.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    Combine(per_chunk[stats_blocks_[blocks[i]].chunk], block_stats[i]);
  }
  return per_chunk;
}

StepGradStats CpuOptimizer::ComputeGradStats(SimdLevel level, const GradBlockReader& read) const {
  StepGradStats out;
  out.per_chunk = PerChunkStats(std::vector<bool>(chunks_.size(), true), level, 0, read);
  for (const GradStats& s : out.per_chunk) Combine(out.total, s);
  return out;
}

StepGradStats CpuOptimizer::ComputeGradStats(const std::vector<std::optional<GradStats>>& known,
                                             const GradBlockReader& read) const {
  std::vector<bool> wanted(chunks_.size());
  for (size_t c = 0; c < chunks_.size(); ++c) wanted[c] = !known[c].has_value();
  StepGradStats out;
  out.per_chunk = PerChunkStats(wanted, ActiveSimdLevel(), 0, read);
  for (size_t c = 0; c < chunks_.size(); ++c) {
    if (known[c].has_value()) out.per_chunk[c] = *known[c];
    Combine(out.total, out.per_chunk[c]);
  }
  return out;
}

std::vector<GradStats> CpuOptimizer::ComputeChunkGradStats(const std::vector<int>& which,
                                                           int max_workers,
                                                           const GradBlockReader& read) const {
  std::vector<bool> wanted(chunks_.size(), false);
  for (const int c : which) wanted[static_cast<size_t>(c)] = true;
  const std::vector<GradStats> per_chunk =
      PerChunkStats(wanted, ActiveSimdLevel(), max_workers, read);
  std::vector<GradStats> out;
  out.reserve(which.size());
  for (const int c : which) out.push_back(per_chunk[static_cast<size_t>(c)]);
  return out;
}

}  // namespace zo
