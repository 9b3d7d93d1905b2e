// A fixed set of equal, 4 KiB-aligned buffers for O_DIRECT transfers, made
// once and reused, so that an io_uring engine can register them (pinned
// once, not per request; IoEngine::RegisterBuffers).
//
//   ZO_ASSIGN_OR_RETURN(auto pool, AlignedBufferPool::Create(4, 16 << 20));
//   ZO_RETURN_IF_ERROR(engine->RegisterBuffers(*pool));
//   AlignedBufferPool::Lease buf = pool->Acquire();  // back to the pool when it goes
//   ZO_RETURN_IF_ERROR(ReadFully(*engine, fd, 0, buf.data(), buf.size()));
#ifndef ZO_OFFLOAD_IO_ALIGNED_BUFFER_POOL_H_
#define ZO_OFFLOAD_IO_ALIGNED_BUFFER_POOL_H_

#include <sys/uio.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "offload/aligned_buffer.h"

namespace zo {

// Thread-safe. The pool must outlive its leases and any engine it is
// registered with.
class AlignedBufferPool {
 public:
  // One buffer, borrowed until the lease is destroyed (move-only).
  class Lease {
   public:
    Lease() = default;
    ~Lease() { Release(); }
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

    bool valid() const { return pool_ != nullptr; }
    char* data() const;
    size_t size() const;
    int index() const { return index_; }  // 0..count-1; the registered buffer index
    void Release();                       // returns the buffer early

   private:
    friend class AlignedBufferPool;
    Lease(AlignedBufferPool* pool, int index) : pool_(pool), index_(index) {}
    AlignedBufferPool* pool_ = nullptr;
    int index_ = -1;
  };

  // `count` buffers of `buffer_bytes` each (a positive multiple of 4096).
  // INVALID_ARGUMENT for bad sizes, RESOURCE_EXHAUSTED when memory is short.
  static absl::StatusOr<std::unique_ptr<AlignedBufferPool>> Create(size_t count,
                                                                   size_t buffer_bytes);
  ~AlignedBufferPool();

  // Blocks until a buffer is free.
  Lease Acquire();
  // A free buffer, or nullopt when all are leased.
  std::optional<Lease> TryAcquire();

  size_t count() const { return count_; }
  size_t buffer_bytes() const { return buffer_bytes_; }
  size_t available() const;
  char* buffer(int index) const { return memory_.as<char>() + index * buffer_bytes_; }
  // One iovec per buffer, in index order (what io_uring registers).
  std::vector<iovec> iovecs() const;

 private:
  AlignedBufferPool(AlignedBuffer memory, size_t count, size_t buffer_bytes);
  void Return(int index);
  bool HasFree() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !free_.empty(); }

  const AlignedBuffer memory_;
  const size_t count_;
  const size_t buffer_bytes_;
  mutable absl::Mutex mu_;
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zo

#endif  // ZO_OFFLOAD_IO_ALIGNED_BUFFER_POOL_H_
