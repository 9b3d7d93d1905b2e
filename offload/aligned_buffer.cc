#include "offload/aligned_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace zo {
namespace {

constexpr size_t kHugePageBytes = size_t{2} << 20;

}  // namespace

absl::StatusOr<AlignedBuffer> AlignedBuffer::Allocate(size_t bytes) {
  if (bytes == 0) return AlignedBuffer();
  const size_t mapped = RoundUpTo(bytes, kPageBytes);
  void* data = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) {
    const int err = errno;
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of ", mapped, " bytes failed: ", std::strerror(err)));
  }
#ifdef MADV_HUGEPAGE
  // Advice only: a kernel without THP just ignores it.
  if (mapped >= kHugePageBytes) madvise(data, mapped, MADV_HUGEPAGE);
#endif
  return AlignedBuffer(data, bytes, mapped);
}

AlignedBuffer::~AlignedBuffer() { Release(); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
  }
  return *this;
}

void AlignedBuffer::Release() {
  if (data_ != nullptr) munmap(data_, mapped_);
  data_ = nullptr;
  size_ = 0;
  mapped_ = 0;
}

}  // namespace zo
