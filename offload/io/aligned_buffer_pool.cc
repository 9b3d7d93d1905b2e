#include "offload/io/aligned_buffer_pool.h"

#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace zo {

AlignedBufferPool::Lease::Lease(Lease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)), index_(std::exchange(other.index_, -1)) {}

AlignedBufferPool::Lease& AlignedBufferPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = std::exchange(other.pool_, nullptr);
    index_ = std::exchange(other.index_, -1);
  }
  return *this;
}

char* AlignedBufferPool::Lease::data() const {
  return pool_ == nullptr ? nullptr : pool_->buffer(index_);
}

size_t AlignedBufferPool::Lease::size() const {
  return pool_ == nullptr ? 0 : pool_->buffer_bytes();
}

void AlignedBufferPool::Lease::Release() {
  if (pool_ != nullptr) pool_->Return(index_);
  pool_ = nullptr;
  index_ = -1;
}

absl::StatusOr<std::unique_ptr<AlignedBufferPool>> AlignedBufferPool::Create(size_t count,
                                                                             size_t buffer_bytes) {
  if (count == 0 || count > (1u << 14)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AlignedBufferPool: count ", count, " is not in [1, 16384]"));
  }
  if (buffer_bytes == 0 || buffer_bytes % kPageBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat("AlignedBufferPool: buffer_bytes ", buffer_bytes,
                                                   " is not a positive multiple of ", kPageBytes));
  }
  // io_uring takes at most 1 GiB per registered buffer.
  if (buffer_bytes > (size_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AlignedBufferPool: buffer_bytes ", buffer_bytes, " is above 1 GiB"));
  }
  if (count > SIZE_MAX / buffer_bytes) {
    return absl::InvalidArgumentError("AlignedBufferPool: count * buffer_bytes overflows");
  }
  ZO_ASSIGN_OR_RETURN(AlignedBuffer memory, AlignedBuffer::Allocate(count * buffer_bytes));
  return std::unique_ptr<AlignedBufferPool>(
      new AlignedBufferPool(std::move(memory), count, buffer_bytes));
}

AlignedBufferPool::AlignedBufferPool(AlignedBuffer memory, size_t count, size_t buffer_bytes)
    : memory_(std::move(memory)), count_(count), buffer_bytes_(buffer_bytes) {
  free_.reserve(count);
  // Lowest index on top, so buffers are handed out in order.
  for (size_t i = count; i > 0; --i) free_.push_back(static_cast<int>(i - 1));
}

AlignedBufferPool::~AlignedBufferPool() {
  absl::MutexLock lock(&mu_);
  if (free_.size() != count_) {
    ZO_LOG(ERROR) << "AlignedBufferPool destroyed with " << count_ - free_.size()
                  << " buffers still leased";
  }
}

AlignedBufferPool::Lease AlignedBufferPool::Acquire() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &AlignedBufferPool::HasFree));
  const int index = free_.back();
  free_.pop_back();
  return Lease(this, index);
}

std::optional<AlignedBufferPool::Lease> AlignedBufferPool::TryAcquire() {
  absl::MutexLock lock(&mu_);
  if (free_.empty()) return std::nullopt;
  const int index = free_.back();
  free_.pop_back();
  return Lease(this, index);
}

size_t AlignedBufferPool::available() const {
  absl::MutexLock lock(&mu_);
  return free_.size();
}

std::vector<iovec> AlignedBufferPool::iovecs() const {
  std::vector<iovec> out(count_);
  for (size_t i = 0; i < count_; ++i) out[i] = {buffer(static_cast<int>(i)), buffer_bytes_};
  return out;
}

void AlignedBufferPool::Return(int index) {
  absl::MutexLock lock(&mu_);
  free_.push_back(index);
}

}  // namespace zo
