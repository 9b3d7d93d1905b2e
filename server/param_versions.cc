#include "server/param_versions.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zo {

absl::StatusOr<std::unique_ptr<ParamVersions>> ParamVersions::Create(int64_t elems, DType dtype) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(elems, 1)) * DTypeSize(dtype);
  ZO_ASSIGN_OR_RETURN(AlignedBuffer a, AlignedBuffer::Allocate(bytes));
  ZO_ASSIGN_OR_RETURN(AlignedBuffer b, AlignedBuffer::Allocate(bytes));
  return std::unique_ptr<ParamVersions>(
      new ParamVersions(elems, dtype, std::move(a), std::move(b)));
}

ParamVersions::ParamVersions(int64_t elems, DType dtype, AlignedBuffer a, AlignedBuffer b)
    : elems_(elems), dtype_(dtype) {
  buffers_[0].memory = std::move(a);
  buffers_[1].memory = std::move(b);
  buffers_[0].data_version = 0;
  data_version_ = {0};
}

void ParamVersions::Reset(int64_t version) {
  std::unique_lock lock(mu_);
  readers_done_.wait(
      lock, [&] { return Unblocked(buffers_[0].readers == 0 && buffers_[1].readers == 0); });
  base_ = version;
  data_version_ = {version};
  buffers_[0].data_version = -1;
  buffers_[1].data_version = -1;
}

bool ParamVersions::Unblocked(bool free) {
  if (!free) ++times_blocked_;
  return free;
}

int64_t ParamVersions::times_blocked() const {
  std::lock_guard lock(mu_);
  return times_blocked_;
}

void ParamVersions::CommitBase() {
  std::lock_guard lock(mu_);
  buffers_[0].data_version = base_;
}

void* ParamVersions::base_data() { return buffers_[0].memory.data(); }

void* ParamVersions::BeginWrite() {
  std::unique_lock lock(mu_);
  const int64_t current = data_version_.back();
  const int target = buffers_[0].data_version == current ? 1 : 0;
  readers_done_.wait(lock, [&] { return Unblocked(buffers_[target].readers == 0); });
  buffers_[target].data_version = -1;  // no new lease on it until CommitWrite
  writing_ = target;
  return buffers_[target].memory.data();
}

void ParamVersions::CommitWrite(int64_t version) {
  std::lock_guard lock(mu_);
  buffers_[writing_].data_version = version;
  writing_ = -1;
  data_version_.push_back(version);
}

void ParamVersions::RecordSkip(int64_t /*version*/) {
  std::lock_guard lock(mu_);
  data_version_.push_back(data_version_.back());
}

int64_t ParamVersions::latest() const {
  std::lock_guard lock(mu_);
  return base_ + static_cast<int64_t>(data_version_.size()) - 1;
}

std::optional<int64_t> ParamVersions::DataVersion(int64_t version) const {
  std::lock_guard lock(mu_);
  return DataVersionLocked(version);
}

std::optional<int64_t> ParamVersions::DataVersionLocked(int64_t version) const {
  const int64_t i = version - base_;
  if (i < 0 || i >= static_cast<int64_t>(data_version_.size())) return std::nullopt;
  return data_version_[i];
}

absl::StatusOr<ParamVersions::Lease> ParamVersions::Acquire(int64_t version) {
  std::lock_guard lock(mu_);
  const std::optional<int64_t> data = DataVersionLocked(version);
  if (data.has_value()) {
    for (int b = 0; b < 2; ++b) {
      if (buffers_[b].data_version == *data) {
        ++buffers_[b].readers;
        return Lease(this, b);
      }
    }
  }
  const int64_t latest = base_ + static_cast<int64_t>(data_version_.size()) - 1;
  return absl::FailedPreconditionError(
      absl::StrCat("version ", version, " is not held (latest is ", latest,
                   "; only the two newest distinct versions are kept)"));
}

ParamVersions::Lease::~Lease() {
  if (owner_ == nullptr) return;
  std::lock_guard lock(owner_->mu_);
  if (--owner_->buffers_[buffer_].readers == 0) owner_->readers_done_.notify_all();
}

const void* ParamVersions::Lease::data() const { return owner_->buffers_[buffer_].memory.data(); }

}  // namespace zo
