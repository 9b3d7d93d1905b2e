#include "server/snapshot_staging.h"

#include <algorithm>
#include <utility>

namespace zo {

SnapshotStaging::SnapshotStaging(int64_t limit_bytes, int64_t buffer_floats)
    : buffer_floats_(std::max<int64_t>(buffer_floats, 1)),
      max_buffers_(std::max<int64_t>(limit_bytes, 0) /
                   (buffer_floats_ * static_cast<int64_t>(sizeof(float)))) {}

std::unique_ptr<float[]> SnapshotStaging::Take() {
  std::lock_guard lock(mu_);
  if (!free_.empty()) {
    std::unique_ptr<float[]> b = std::move(free_.back());
    free_.pop_back();
    return b;
  }
  if (allocated_ >= max_buffers_) return nullptr;
  ++allocated_;
  return std::unique_ptr<float[]>(new float[static_cast<size_t>(buffer_floats_)]);
}

void SnapshotStaging::Give(std::unique_ptr<float[]> buffer) {
  if (buffer == nullptr) return;
  std::lock_guard lock(mu_);
  free_.push_back(std::move(buffer));
}

int64_t SnapshotStaging::held_bytes() const {
  std::lock_guard lock(mu_);
  return allocated_ * buffer_floats_ * static_cast<int64_t>(sizeof(float));
}

}  // namespace zo
