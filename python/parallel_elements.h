// Element-wise work over several tensors (widening pulled weights, rounding
// gradients) shared by all of the host's cores, with the GIL released by
// the caller: torch's own copies run on its intra-op threads, which a
// script that leaves the cores to its offload server sets to one.
#ifndef ZO_PYTHON_PARALLEL_ELEMENTS_H_
#define ZO_PYTHON_PARALLEL_ELEMENTS_H_

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"

namespace zo::python {

// fn(item, begin, end) over every item's elements [0, elems[item]), cut
// into pieces of at most 64 Ki elements that the calling thread and up to
// HostThreads() - 1 helpers take in turn; returns when all are done. fn
// must be safe to call concurrently on disjoint pieces.
void ForElementsInParallel(absl::Span<const int64_t> elems,
                           absl::FunctionRef<void(size_t item, int64_t begin, int64_t end)> fn);

}  // namespace zo::python

#endif  // ZO_PYTHON_PARALLEL_ELEMENTS_H_
