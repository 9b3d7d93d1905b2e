// Page-aligned memory that is reserved but not touched: the first thread to
// write a page decides which NUMA node backs it (Linux first-touch policy).
// The step engine (offload/cpu_optimizer.h) then zeroes each worker's range
// from that worker, so every core updates memory local to it.
//
//   ZO_ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::Allocate(n * sizeof(float)));
//   float* p = buf.as<float>();  // pages not yet backed; reads would see zeros
#ifndef ZO_OFFLOAD_ALIGNED_BUFFER_H_
#define ZO_OFFLOAD_ALIGNED_BUFFER_H_

#include <cstddef>

#include "absl/status/statusor.h"

namespace zo {

inline constexpr size_t kCacheLineBytes = 64;
inline constexpr size_t kPageBytes = 4096;

// Rounds `n` up to a multiple of `align` (a power of two).
constexpr size_t RoundUpTo(size_t n, size_t align) { return (n + align - 1) & ~(align - 1); }

// Owns one anonymous mapping (move-only). Thread-compatible: the object is
// not synchronized, the memory is plain memory that threads may share.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  // Maps `bytes` (rounded up to a page) of zero pages, kPageBytes-aligned,
  // without touching them. Large buffers ask for transparent huge pages
  // (fewer TLB misses when streaming; first-touch placement is then decided
  // per 2 MiB). RESOURCE_EXHAUSTED when the kernel refuses the mapping.
  static absl::StatusOr<AlignedBuffer> Allocate(size_t bytes);

  void* data() const { return data_; }
  size_t size() const { return size_; }  // bytes, as requested
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  AlignedBuffer(void* data, size_t size, size_t mapped)
      : data_(data), size_(size), mapped_(mapped) {}
  void Release();

  void* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;  // bytes mapped (a page multiple)
};

}  // namespace zo

#endif  // ZO_OFFLOAD_ALIGNED_BUFFER_H_
