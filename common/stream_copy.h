// Copies that bypass the cache, for a destination this core will not read
// again soon: a pull's buffer filled while the update runs, a shared region
// another process reads. A plain store first reads each destination line
// from memory and evicts the caller's working set with it; a non-temporal
// one does neither.
//
//   StreamCopy(master, pull_buffer, n * sizeof(float));
//
// Contracts: `src` holds n readable bytes and `dst` n writable ones, no
// alignment required; they must not overlap; n may be 0. The stores are
// fenced before it returns, so a thread told afterwards sees them. Worth it
// only for large copies (a cache line is written whole or not at all); on
// other than x86-64 it is memcpy.
#ifndef ZO_COMMON_STREAM_COPY_H_
#define ZO_COMMON_STREAM_COPY_H_

#include <cstddef>

namespace zo {

void StreamCopy(const void* src, void* dst, size_t n);

// Below this a copy goes through the cache (memcpy): a gRPC slice, a small
// tensor. One core copies 64 MiB in 4 MiB pieces here in 3.3-3.7 ms with
// StreamCopy and 6.5-7.4 ms with memcpy.
inline constexpr size_t kStreamCopyMinBytes = size_t{64} << 10;

}  // namespace zo

#endif  // ZO_COMMON_STREAM_COPY_H_
