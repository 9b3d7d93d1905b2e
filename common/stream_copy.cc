#include "common/stream_copy.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace zo {

void StreamCopy(const void* src, void* dst, size_t n) {
  if (n == 0) return;
  const auto* s = static_cast<const std::byte*>(src);
  auto* d = static_cast<std::byte*>(dst);
  size_t i = 0;
#if defined(__x86_64__)
  // Plain copies for the head up to the first 16-byte boundary and for the
  // tail; 16-byte non-temporal stores between.
  i = std::min(n, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, i);
  for (; i + 16 <= n; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
  }
#endif
  std::memcpy(d + i, s + i, n - i);
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace zo
