#include "server/snapshot_staging.h"

#include <algorithm>
#include <utility>

namespace zo {

SnapshotStaging::SnapshotStaging(int64_t limit_bytes, int64_t buffer_floats)
    : buffer_floats_(std::max<int64_t>(buffer_floats, 1)),
      max_buffers_(std::max<int64_t>(limit_bytes, 0) /
                   (buffer_floats_ * static_cast<int64_t>(sizeof(float)))) {}

AlignedBuffer SnapshotStaging::Take() {
  {
    std::lock_guard lock(mu_);
    if (!free_.empty()) {
      AlignedBuffer b = std::move(free_.back());
      free_.pop_back();
      return b;
    }
    if (allocated_ >= max_buffers_) return AlignedBuffer();
    ++allocated_;
  }
  absl::StatusOr<AlignedBuffer> b =
      AlignedBuffer::Allocate(static_cast<size_t>(buffer_floats_) * sizeof(float));
  if (b.ok()) return *std::move(b);
  std::lock_guard lock(mu_);
  --allocated_;
  return AlignedBuffer();
}

void SnapshotStaging::Give(AlignedBuffer buffer) {
  if (buffer.data() == nullptr) return;
  std::lock_guard lock(mu_);
  free_.push_back(std::move(buffer));
}

int64_t SnapshotStaging::held_bytes() const {
  std::lock_guard lock(mu_);
  return allocated_ * buffer_floats_ * static_cast<int64_t>(sizeof(float));
}

}  // namespace zo
