// Where a server's update reads a step's gradients: its accumulator's own
// buffer, except for the blocks an in-process worker lent
// (GradientAccumulator::TryPush with `lent`), which are read where the
// worker keeps them, so that they are never copied
// (docs/architecture.md, "Routes").
//
//   GradientSource g = accum->gradients();
//   AdamUpdate(k, g.At(offset, n), ...);  // [offset, offset + n) in one block
//
// Blocks are kGradientBlockElems elements of the server's local index
// space, from element 0. Every reader reads within one block at a time:
// the statistics' blocks (kStatsBlockElems, from each chunk's start, which
// the accumulator lends only where chunks start on a block) and the update's
// tiles (kTileElems, which divides a block) do.
#ifndef ZO_OFFLOAD_GRADIENT_SOURCE_H_
#define ZO_OFFLOAD_GRADIENT_SOURCE_H_

#include <cassert>
#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "offload/cpu_optimizer.h"
#include "offload/optimizer_kernels.h"

namespace zo {

inline constexpr int64_t kGradientBlockElems = static_cast<int64_t>(kStatsBlockElems);

struct GradientSource {
  // One buffer, indexed by local element: every gradient in it.
  GradientSource(TypedConstPtr own) : own(own) {}  // NOLINT(google-explicit-constructor)
  GradientSource(const void* data, DType dtype) : own{data, dtype} {}
  // `lent` (may be null) has an entry per block: where that block's first
  // element is kept, or null for the block in `own`.
  static GradientSource WithLent(TypedConstPtr own, const std::byte* const* lent) {
    GradientSource g(own);
    g.lent = lent;
    return g;
  }

  bool empty() const { return own.data == nullptr; }
  DType dtype() const { return own.dtype; }

  // The gradients of local elements [at, at + n), which lie in one block.
  TypedConstPtr At(int64_t at, [[maybe_unused]] int64_t n) const {
    if (lent != nullptr) {
      assert(n <= 0 || at / kGradientBlockElems == (at + n - 1) / kGradientBlockElems);
      const int64_t block = at / kGradientBlockElems;
      if (const std::byte* b = lent[block]; b != nullptr) {
        return {b + (at - block * kGradientBlockElems) * static_cast<int64_t>(DTypeSize(own.dtype)),
                own.dtype};
      }
    }
    return OffsetBy(own, static_cast<size_t>(at));
  }

  TypedConstPtr own;
  const std::byte* const* lent = nullptr;
};

}  // namespace zo

#endif  // ZO_OFFLOAD_GRADIENT_SOURCE_H_
