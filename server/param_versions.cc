#include "server/param_versions.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "rpc/error_detail.h"

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
  v->master_data_ = 0;
  return v;
}

ParamVersions::ParamVersions(int64_t elems, DType dtype, FromMaster from)
    : elems_(elems), dtype_(dtype), from_(std::move(from)) {
  data_version_ = {0};
}

int64_t ParamVersions::BufferBytes(int64_t elems, DType dtype, bool from_master) {
  return from_master ? 0 : 2 * elems * static_cast<int64_t>(DTypeSize(dtype));
}

int64_t ParamVersions::buffer_bytes() const {
  std::lock_guard lock(mu_);
  return BufferBytes(elems_, dtype_, from_master()) + correction_stats_.bytes +
         static_cast<int64_t>(restoring_previous_.size());
}

ParamVersions::CorrectionStats ParamVersions::corrections() const {
  std::lock_guard lock(mu_);
  return correction_stats_;
}

bool ParamVersions::Unblocked(bool free) {
  if (!free) ++times_blocked_;
  return free;
}

bool ParamVersions::NoReadersLocked() const {
  return buffers_[0].readers == 0 && buffers_[1].readers == 0 && master_pins_ == 0 &&
         master_reading_ == 0 && previous_pins_ == 0;
}

int64_t ParamVersions::times_blocked() const {
  std::lock_guard lock(mu_);
  return times_blocked_;
}

ParamVersions::Corrections ParamVersions::FindCorrections(const void* truth, const void* undone,
                                                          int64_t n) const {
  const size_t size = DTypeSize(dtype_);
  const auto* t = static_cast<const uint8_t*>(truth);
  const auto* u = static_cast<const uint8_t*>(undone);
  Corrections c;
  c.n = n;
  // Past this many, a copy of the range is smaller.
  const auto most = static_cast<size_t>(n) * size / (sizeof(uint32_t) + size);
  for (int64_t i = 0; i < n; ++i) {
    // Whole blocks that agree are skipped at memcmp's speed.
    if (i % 64 == 0 && i + 64 <= n && std::memcmp(t + i * size, u + i * size, 64 * size) == 0) {
      i += 63;
      continue;
    }
    if (std::memcmp(t + i * size, u + i * size, size) == 0) continue;
    if (c.index.size() == most) {
      c.index = {};
      c.values = {};
      c.whole.assign(t, t + n * size);
      return c;
    }
    c.index.push_back(static_cast<uint32_t>(i));
    c.values.insert(c.values.end(), t + i * size, t + (i + 1) * size);
  }
  return c;
}

void ParamVersions::AddCorrectionsLocked(int64_t offset, Corrections c) {
  if (c.index.empty() && c.whole.empty()) return;
  correction_stats_.elems += c.whole.empty() ? static_cast<int64_t>(c.index.size()) : c.n;
  correction_stats_.bytes += c.bytes();
  corrections_.insert_or_assign(offset, std::move(c));
}

void ParamVersions::ClearCorrectionsLocked() {
  corrections_.clear();
  correction_stats_ = {};
}

void ParamVersions::ApplyCorrectionsLocked(int64_t offset, int64_t n, void* out) const {
  const size_t size = DTypeSize(dtype_);
  auto* dst = static_cast<uint8_t*>(out);
  const int64_t end = offset + n;
  auto it = corrections_.upper_bound(offset);
  if (it != corrections_.begin()) --it;
  for (; it != corrections_.end() && it->first < end; ++it) {
    const int64_t begin = it->first;
    const Corrections& c = it->second;
    if (begin + c.n <= offset) continue;
    const int64_t lo = std::max(begin, offset), hi = std::min(begin + c.n, end);
    if (!c.whole.empty()) {
      std::memcpy(dst + (lo - offset) * size, c.whole.data() + (lo - begin) * size,
                  (hi - lo) * size);
      continue;
    }
    auto i = std::lower_bound(c.index.begin(), c.index.end(), static_cast<uint32_t>(lo - begin));
    for (; i != c.index.end() && begin + *i < hi; ++i) {
      const auto k = static_cast<size_t>(i - c.index.begin());
      std::memcpy(dst + (begin + *i - offset) * size, c.values.data() + k * size, size);
    }
  }
}

absl::Status ParamVersions::Reset(int64_t version, Previous previous) {
  std::unique_lock lock(mu_);
  readers_done_.wait(lock, [&] { return Unblocked(NoReadersLocked()); });
  if (previous == Previous::kStored && !keep_previous()) previous = Previous::kNone;
  if (version < 1) previous = Previous::kNone;
  if (previous == Previous::kStored && from_master()) {
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(elems_, 1)) * DTypeSize(dtype_);
    absl::StatusOr<AlignedBuffer> buffer = AlignedBuffer::Allocate(bytes);
    if (!buffer.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("restoring the version before ", version, ": ", buffer.status().message()));
    }
    restoring_previous_ = *std::move(buffer);
  }
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
  EndWritingLocked();  // reads waiting for an update's ranges are told it is gone
  ClearCorrectionsLocked();
  undo_ = nullptr;
  buffers_[0].data_version = -1;
  buffers_[1].data_version = -1;
  master_data_ = -1;
  previous_data_ = -1;
  return absl::OkStatus();
}

void ParamVersions::CommitBase(const Undo& undo) {
  std::unique_lock lock(mu_);
  const int64_t latest = data_version_.back();
  const Previous previous = resetting_previous_;
  resetting_previous_ = Previous::kNone;
  if (!from_master()) {
    buffers_[0].data_version = latest;
    if (previous == Previous::kStored) buffers_[1].data_version = latest - 1;
    return;
  }
  if (previous == Previous::kStored) {
    // Nothing reads yet (master_data_ is -1): the state is the restored one.
    AlignedBuffer stored = std::move(restoring_previous_);
    lock.unlock();
    constexpr int64_t kRange = int64_t{1} << 16;
    const size_t size = DTypeSize(dtype_);
    std::vector<uint8_t> undone(static_cast<size_t>(kRange) * size);
    std::vector<std::pair<int64_t, Corrections>> found;
    for (int64_t at = 0; at < elems_; at += kRange) {
      const int64_t n = std::min(kRange, elems_ - at);
      const auto* truth = static_cast<const uint8_t*>(stored.data()) + at * size;
      if (undo) {
        undo(at, n, undone.data());
        found.emplace_back(at, FindCorrections(truth, undone.data(), n));
      } else {
        Corrections c;
        c.n = n;
        c.whole.assign(truth, truth + n * size);
        found.emplace_back(at, std::move(c));
      }
    }
    lock.lock();
    for (auto& [at, c] : found) AddCorrectionsLocked(at, std::move(c));
    undo_ = undo;
    previous_data_ = latest - 1;
  }
  master_data_ = latest;
}

void* ParamVersions::base_data() { return from_master() ? nullptr : buffers_[0].memory.data(); }

void* ParamVersions::previous_data() {
  std::lock_guard lock(mu_);
  if (resetting_previous_ != Previous::kStored) return nullptr;
  return from_master() ? restoring_previous_.data() : buffers_[1].memory.data();
}

void* ParamVersions::BeginWrite(Undo undo) {
  std::unique_lock lock(mu_);
  if (from_master()) {
    if (from_.keep_previous) {
      // The version before the latest is replaced (a checkpoint writing it
      // lets go first); the latest becomes derivable range by range as the
      // update finishes them (MarkKept).
      readers_done_.wait(lock, [&] { return Unblocked(previous_pins_ == 0); });
      previous_data_ = -1;
      keeping_ = master_data_;
    } else {
      // New pulls no longer pin the master (they could hold the update off
      // for ever); theirs are the workers that died, and they are told the
      // version is gone once the update begins.
      update_waiting_ = true;
      readers_done_.wait(lock,
                         [&] { return Unblocked(master_pins_ == 0 && master_reading_ == 0); });
      update_waiting_ = false;
    }
    master_data_ = -1;  // reads of it now wait for its ranges (or fail)
    writing_version_ = base_ + static_cast<int64_t>(data_version_.size());
    done_ranges_.Clear();
    // A read of the master or of the state began before: the update must
    // not change the state under it, nor the undo it used.
    readers_done_.wait(lock, [&] { return Unblocked(master_reading_ == 0); });
    ClearCorrectionsLocked();
    undo_ = std::move(undo);
    return nullptr;
  }
  const int64_t current = data_version_.back();
  const int target = buffers_[0].data_version == current ? 1 : 0;
  readers_done_.wait(lock, [&] { return Unblocked(buffers_[target].readers == 0); });
  buffers_[target].data_version = -1;  // no new lease on it until CommitWrite
  writing_ = target;
  return buffers_[target].memory.data();
}

void ParamVersions::ClaimRange(int64_t offset, int64_t n) {
  std::unique_lock lock(mu_);
  if (keeping_ < 0) return;
  claimed_ranges_.Add(offset, offset + n);  // no read ahead of the update starts in it now
  readers_done_.wait(lock, [&] { return Unblocked(!ReadAheadLocked(offset, n)); });
}

bool ParamVersions::ReadAheadLocked(int64_t offset, int64_t n) const {
  return std::any_of(reads_ahead_.begin(), reads_ahead_.end(),
                     [&](const auto& r) { return r.first < offset + n && offset < r.second; });
}

void ParamVersions::MarkDone(int64_t offset, int64_t n) {
  std::lock_guard lock(mu_);
  if (writing_version_ < 0) return;  // aborted meanwhile
  done_ranges_.Add(offset, offset + n);
  NotifyRangeReadersLocked();
}

RangeSet ParamVersions::DoneRanges(int64_t version) const {
  std::lock_guard lock(mu_);
  if (writing_version_ >= 0 && version == writing_version_) return done_ranges_;
  RangeSet done;
  if (DataVersionLocked(version).has_value()) done.Add(0, elems_);
  return done;
}

void ParamVersions::MarkKept(int64_t offset, int64_t n, const void* old_weights) {
  Corrections c;
  if (undo_) {
    // undo_ is set before the update's first tile and stays until the next
    // update or restore, which cannot begin while this one runs.
    thread_local std::vector<uint8_t> undone;
    undone.resize(static_cast<size_t>(n) * DTypeSize(dtype_));
    undo_(offset, n, undone.data());
    c = FindCorrections(old_weights, undone.data(), n);
  } else {
    const auto* w = static_cast<const uint8_t*>(old_weights);
    c.n = n;
    c.whole.assign(w, w + n * DTypeSize(dtype_));
  }
  std::lock_guard lock(mu_);
  KeptLocked(offset, n, std::move(c));
}

void ParamVersions::MarkKept(int64_t offset, int64_t n, std::vector<uint32_t> index,
                             std::vector<uint8_t> values) {
  const size_t size = DTypeSize(dtype_);
  Corrections c;
  c.n = n;
  if (index.size() * (sizeof(uint32_t) + size) > static_cast<size_t>(n) * size) {
    // Smaller as a copy: the undo, mended.
    c.whole.resize(static_cast<size_t>(n) * size);
    if (undo_) undo_(offset, n, c.whole.data());
    for (size_t k = 0; k < index.size(); ++k) {
      std::memcpy(c.whole.data() + index[k] * size, values.data() + k * size, size);
    }
  } else {
    c.index = std::move(index);
    c.values = std::move(values);
  }
  std::lock_guard lock(mu_);
  KeptLocked(offset, n, std::move(c));
}

void ParamVersions::KeptLocked(int64_t offset, int64_t n, Corrections c) {
  if (keeping_ < 0) return;  // aborted meanwhile
  AddCorrectionsLocked(offset, std::move(c));
  done_ranges_.Add(offset, offset + n);
  NotifyRangeReadersLocked();
}

void ParamVersions::NotifyRangeReadersLocked() {
  for (const auto& [begin, end] : waited_ranges_) {
    if (done_ranges_.Contains(begin, end)) {
      range_done_.notify_all();
      return;
    }
  }
}

void ParamVersions::AwaitRangeLocked(std::unique_lock<std::mutex>& lock, int64_t offset,
                                     int64_t n) {
  ++times_blocked_;
  waited_ranges_.emplace_back(offset, offset + n);
  range_done_.wait(lock);
  waited_ranges_.erase(std::find(waited_ranges_.begin(), waited_ranges_.end(),
                                 std::pair<int64_t, int64_t>(offset, offset + n)));
}

bool ParamVersions::EndWritingLocked() {
  const bool whole = keeping_ >= 0 && done_ranges_.size() == elems_;
  if (whole) {
    previous_data_ = keeping_;
  } else if (keeping_ >= 0) {
    ClearCorrectionsLocked();
  }
  keeping_ = -1;
  writing_version_ = -1;
  done_ranges_.Clear();
  claimed_ranges_.Clear();  // every tile's claim waited for the reads ahead in it
  if (!waited_ranges_.empty()) range_done_.notify_all();
  return whole;
}

void ParamVersions::CommitWrite(int64_t version) {
  std::lock_guard lock(mu_);
  if (from_master()) {
    const int64_t keeping = keeping_, kept = done_ranges_.size();
    if (!EndWritingLocked() && keeping >= 0) {
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
    EndWritingLocked();
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
  return WithDetail(
      absl::FailedPreconditionError(absl::StrCat(
          "version ", version, " is not held (latest is ", latest, "; only the ",
          keep_previous() ? "two newest distinct versions are" : "newest version is", " kept)")),
      MakeDetail(v1::ErrorDetail::VERSION_NOT_HELD, /*job=*/"", latest));
}

absl::StatusOr<ParamVersions::Lease> ParamVersions::Acquire(int64_t version) {
  std::lock_guard lock(mu_);
  if (writing_version_ >= 0 && version == writing_version_) {
    // Read range by range as the update finishes them. Without a previous
    // version served, the lease keeps the master from the next update.
    if (from_.keep_previous) return Lease(this, Lease::kUnpinned, version);
    ++master_pins_;
    return Lease(this, Lease::kMaster, version);
  }
  const std::optional<int64_t> data = DataVersionLocked(version);
  if (data.has_value()) {
    if (from_master() && master_data_ == *data) {
      // With a previous version served, an update moves the lease's reads to
      // the undo; without one the lease keeps the master as it is.
      if (from_.keep_previous || update_waiting_) return Lease(this, Lease::kUnpinned, version);
      ++master_pins_;
      return Lease(this, Lease::kMaster, version);
    }
    if (from_master() && previous_data_ >= 0 && previous_data_ == *data) {
      ++previous_pins_;
      return Lease(this, Lease::kPrevious, version);
    }
    // Being replaced by the update now: read range by range as it is done.
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

void ParamVersions::RoundMasterUnlocked(std::unique_lock<std::mutex>& lock, int64_t offset,
                                        int64_t n, void* out) {
  ++master_reading_;  // an update or restore waits for it
  lock.unlock();
  from_.round_master(offset, n, out);
  lock.lock();
  if (--master_reading_ == 0) readers_done_.notify_all();
}

absl::Status ParamVersions::ReadFromMaster(int64_t version, int64_t offset, int64_t n, void* out) {
  std::unique_lock lock(mu_);
  for (;;) {
    if (writing_version_ >= 0 && version == writing_version_) {
      if (done_ranges_.Contains(offset, offset + n)) {
        // The update wrote this range's master and will not touch it again.
        RoundMasterUnlocked(lock, offset, n, out);
        return absl::OkStatus();
      }
      AwaitRangeLocked(lock, offset, n);
      continue;
    }
    const std::optional<int64_t> data = DataVersionLocked(version);
    if (!data.has_value()) break;
    if (master_data_ == *data) {
      RoundMasterUnlocked(lock, offset, n, out);
      return absl::OkStatus();
    }
    const bool being_kept = keeping_ >= 0 && keeping_ == *data;
    if ((previous_data_ >= 0 && previous_data_ == *data) ||
        (being_kept && done_ranges_.Contains(offset, offset + n))) {
      ++master_reading_;
      lock.unlock();
      if (undo_) undo_(offset, n, out);
      lock.lock();
      ApplyCorrectionsLocked(offset, n, out);
      if (--master_reading_ == 0) readers_done_.notify_all();
      return absl::OkStatus();
    }
    if (!being_kept) break;
    if (!claimed_ranges_.Overlaps(offset, offset + n)) {
      // The update has not reached the range: the master still holds the
      // version it replaces there, and the update's claim of the range
      // waits for this read (a restore after a failed update waits for it
      // as for any read of the master).
      const std::pair<int64_t, int64_t> read(offset, offset + n);
      reads_ahead_.push_back(read);
      RoundMasterUnlocked(lock, offset, n, out);
      reads_ahead_.erase(std::find(reads_ahead_.begin(), reads_ahead_.end(), read));
      readers_done_.notify_all();
      return absl::OkStatus();
    }
    // The update is writing the range: a tile's time at most.
    AwaitRangeLocked(lock, offset, n);
  }
  return NotHeldLocked(version);
}

ParamVersions::Lease::~Lease() {
  if (owner_ == nullptr || buffer_ == kUnpinned) return;
  std::lock_guard lock(owner_->mu_);
  int& readers = buffer_ == kMaster     ? owner_->master_pins_
                 : buffer_ == kPrevious ? owner_->previous_pins_
                                        : owner_->buffers_[buffer_].readers;
  if (--readers == 0) owner_->readers_done_.notify_all();
}

const void* ParamVersions::Lease::data() const {
  if (buffer_ < 0) return nullptr;  // from the master: computed by Read
  return owner_->buffers_[buffer_].memory.data();
}

absl::Status ParamVersions::Lease::Read(int64_t offset, int64_t n, void* out) const {
  if (buffer_ < 0) return owner_->ReadFromMaster(version_, offset, n, out);
  const size_t size = DTypeSize(owner_->dtype_);
  std::memcpy(out, static_cast<const char*>(data()) + offset * size, n * size);
  return absl::OkStatus();
}

}  // namespace zo
