#include "server/param_versions.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace zo {

absl::StatusOr<std::unique_ptr<ParamVersions>> ParamVersions::Create(int64_t elems, DType dtype) {
  std::unique_ptr<ParamVersions> v(new ParamVersions(elems, dtype, FromMaster{}));
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(elems, 1)) * DTypeSize(dtype);
  for (Buffer& b : v->buffers_) {
    ZO_ASSIGN_OR_RETURN(b.memory, AlignedBuffer::Allocate(bytes));
  }
  v->buffers_[0].data_version = 0;
  return v;
}

absl::StatusOr<std::unique_ptr<ParamVersions>> ParamVersions::CreateFromMaster(int64_t elems,
                                                                               DType dtype,
                                                                               FromMaster from) {
  if (!from.round_master) {
    return absl::InvalidArgumentError("ParamVersions::CreateFromMaster needs round_master");
  }
  std::unique_ptr<ParamVersions> v(new ParamVersions(elems, dtype, std::move(from)));
  if (v->num_buffers() == 1) {
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(elems, 1)) * DTypeSize(dtype);
    ZO_ASSIGN_OR_RETURN(v->buffers_[0].memory, AlignedBuffer::Allocate(bytes));
  }
  v->master_data_ = 0;
  return v;
}

ParamVersions::ParamVersions(int64_t elems, DType dtype, FromMaster from)
    : elems_(elems), dtype_(dtype), from_(std::move(from)) {
  data_version_ = {0};
}

int64_t ParamVersions::BufferBytes(int64_t elems, DType dtype, bool from_master,
                                   bool keep_previous) {
  const int buffers = from_master ? (keep_previous ? 1 : 0) : 2;
  return buffers * elems * static_cast<int64_t>(DTypeSize(dtype));
}

bool ParamVersions::Unblocked(bool free) {
  if (!free) ++times_blocked_;
  return free;
}

bool ParamVersions::NoReadersLocked() const {
  return buffers_[0].readers == 0 && buffers_[1].readers == 0 && master_pins_ == 0 &&
         master_reading_ == 0;
}

int64_t ParamVersions::times_blocked() const {
  std::lock_guard lock(mu_);
  return times_blocked_;
}

void ParamVersions::Reset(int64_t version, Previous previous) {
  std::unique_lock lock(mu_);
  readers_done_.wait(lock, [&] { return Unblocked(NoReadersLocked()); });
  if (previous == Previous::kStored && !keep_previous()) previous = Previous::kNone;
  if (version < 1) previous = Previous::kNone;
  resetting_previous_ = previous;
  switch (previous) {
    case Previous::kNone:
      base_ = version;
      data_version_ = {version};
      break;
    case Previous::kStored:
      base_ = version - 1;
      data_version_ = {version - 1, version};
      break;
    case Previous::kSameData:
      base_ = version - 1;
      data_version_ = {version, version};
      break;
  }
  EndKeepingLocked();  // reads waiting for an update's ranges are told it is gone
  buffers_[0].data_version = -1;
  buffers_[1].data_version = -1;
  master_data_ = -1;
}

void ParamVersions::CommitBase() {
  std::lock_guard lock(mu_);
  const int64_t latest = data_version_.back();
  if (from_master()) {
    master_data_ = latest;
  } else {
    buffers_[0].data_version = latest;
  }
  if (resetting_previous_ == Previous::kStored) {
    buffers_[from_master() ? 0 : 1].data_version = latest - 1;
  }
  resetting_previous_ = Previous::kNone;
}

void* ParamVersions::base_data() { return from_master() ? nullptr : buffers_[0].memory.data(); }

void* ParamVersions::previous_data() {
  std::lock_guard lock(mu_);
  if (resetting_previous_ != Previous::kStored) return nullptr;
  return buffers_[from_master() ? 0 : 1].memory.data();
}

void* ParamVersions::BeginWrite() {
  std::unique_lock lock(mu_);
  if (from_master()) {
    void* out = nullptr;
    if (from_.keep_previous) {
      // What the kept buffer held is replaced; the latest version moves
      // there range by range as the update writes it (MarkKept).
      Buffer& kept = buffers_[0];
      readers_done_.wait(lock, [&] { return Unblocked(kept.readers == 0); });
      kept.data_version = -1;
      keeping_ = master_data_;
      kept_ranges_.Clear();
      out = kept.memory.data();
    } else {
      // New pulls no longer pin the master (they could hold the update off
      // for ever); theirs are the workers that died, and they are told the
      // version is gone once the update begins.
      update_waiting_ = true;
      readers_done_.wait(lock,
                         [&] { return Unblocked(master_pins_ == 0 && master_reading_ == 0); });
      update_waiting_ = false;
    }
    master_data_ = -1;  // reads of it now go to the kept buffer (or fail)
    // A read rounding the master began before: the update must not change
    // the master under it.
    readers_done_.wait(lock, [&] { return Unblocked(master_reading_ == 0); });
    return out;
  }
  const int64_t current = data_version_.back();
  const int target = buffers_[0].data_version == current ? 1 : 0;
  readers_done_.wait(lock, [&] { return Unblocked(buffers_[target].readers == 0); });
  buffers_[target].data_version = -1;  // no new lease on it until CommitWrite
  writing_ = target;
  return buffers_[target].memory.data();
}

void ParamVersions::MarkKept(int64_t offset, int64_t n) {
  std::lock_guard lock(mu_);
  kept_ranges_.Add(offset, offset + n);
  if (keep_waiters_ > 0) kept_more_.notify_all();
}

bool ParamVersions::EndKeepingLocked() {
  const bool whole = keeping_ >= 0 && kept_ranges_.size() == elems_;
  if (whole) buffers_[0].data_version = keeping_;
  keeping_ = -1;
  kept_ranges_.Clear();
  if (keep_waiters_ > 0) kept_more_.notify_all();
  return whole;
}

void ParamVersions::CommitWrite(int64_t version) {
  std::lock_guard lock(mu_);
  if (from_master()) {
    const int64_t keeping = keeping_, kept = kept_ranges_.size();
    if (!EndKeepingLocked() && keeping >= 0) {
      ZO_LOG(ERROR) << "ParamVersions: an update kept only " << kept << " of " << elems_
                    << " elements of version " << keeping << "; that version is no longer served";
    }
    master_data_ = version;
  } else {
    buffers_[writing_].data_version = version;
    writing_ = -1;
  }
  data_version_.push_back(version);
}

void ParamVersions::AbortWrite() {
  std::lock_guard lock(mu_);
  if (from_master()) {
    // Partly kept, with the master partly changed: that version is gone.
    EndKeepingLocked();
  } else if (writing_ >= 0) {
    writing_ = -1;  // the buffer holds nothing
  }
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

absl::Status ParamVersions::NotHeldLocked(int64_t version) const {
  const int64_t latest = base_ + static_cast<int64_t>(data_version_.size()) - 1;
  return absl::FailedPreconditionError(absl::StrCat(
      "version ", version, " is not held (latest is ", latest, "; only the ",
      keep_previous() ? "two newest distinct versions are" : "newest version is", " kept)"));
}

absl::StatusOr<ParamVersions::Lease> ParamVersions::Acquire(int64_t version) {
  std::lock_guard lock(mu_);
  const std::optional<int64_t> data = DataVersionLocked(version);
  if (data.has_value()) {
    if (from_master() && master_data_ == *data) {
      // With a kept previous version an update moves the lease's reads to
      // the kept buffer; without one the lease keeps the master as it is.
      if (from_.keep_previous || update_waiting_) return Lease(this, Lease::kUnpinned, version);
      ++master_pins_;
      return Lease(this, Lease::kMaster, version);
    }
    // Being kept by the update now: read range by range as it is kept.
    if (keeping_ >= 0 && keeping_ == *data) return Lease(this, Lease::kUnpinned, version);
    for (int b = 0; b < num_buffers(); ++b) {
      if (buffers_[b].data_version == *data) {
        ++buffers_[b].readers;
        return Lease(this, b, version);
      }
    }
  }
  return NotHeldLocked(version);
}

absl::Status ParamVersions::ReadFromMaster(int64_t version, int64_t offset, int64_t n, void* out) {
  std::unique_lock lock(mu_);
  for (;;) {
    const std::optional<int64_t> data = DataVersionLocked(version);
    if (!data.has_value()) break;
    if (master_data_ == *data) {
      ++master_reading_;
      lock.unlock();
      from_.round_master(offset, n, out);
      lock.lock();
      if (--master_reading_ == 0) readers_done_.notify_all();
      return absl::OkStatus();
    }
    if (num_buffers() != 1) break;
    Buffer& kept = buffers_[0];
    const bool being_kept = keeping_ >= 0 && keeping_ == *data;
    if (kept.data_version == *data || (being_kept && kept_ranges_.Contains(offset, offset + n))) {
      ++kept.readers;
      lock.unlock();
      const size_t size = DTypeSize(dtype_);
      std::memcpy(out, static_cast<const char*>(kept.memory.data()) + offset * size, n * size);
      lock.lock();
      if (--kept.readers == 0) readers_done_.notify_all();
      return absl::OkStatus();
    }
    if (!being_kept) break;
    // The update has not reached this range yet: a tile's time at most.
    ++times_blocked_;
    ++keep_waiters_;
    kept_more_.wait(lock);
    --keep_waiters_;
  }
  return NotHeldLocked(version);
}

ParamVersions::Lease::~Lease() {
  if (owner_ == nullptr || buffer_ == kUnpinned) return;
  std::lock_guard lock(owner_->mu_);
  int& readers = buffer_ == kMaster ? owner_->master_pins_ : owner_->buffers_[buffer_].readers;
  if (--readers == 0) owner_->readers_done_.notify_all();
}

const void* ParamVersions::Lease::data() const {
  if (buffer_ < 0) return nullptr;  // the master, read by rounding it
  return owner_->buffers_[buffer_].memory.data();
}

absl::Status ParamVersions::Lease::Read(int64_t offset, int64_t n, void* out) const {
  if (buffer_ < 0) return owner_->ReadFromMaster(version_, offset, n, out);
  const size_t size = DTypeSize(owner_->dtype_);
  std::memcpy(out, static_cast<const char*>(data()) + offset * size, n * size);
  return absl::OkStatus();
}

}  // namespace zo
