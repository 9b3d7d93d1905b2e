#include "server/pull_fills.h"

#include <algorithm>
#include <utility>

namespace zo {

PullFills::Id PullFills::Register(int64_t version, std::vector<Copy> copies,
                                  const std::function<RangeSet()>& done_so_far, bool early) {
  std::sort(copies.begin(), copies.end(),
            [](const Copy& a, const Copy& b) { return a.local_offset < b.local_offset; });
  std::unique_lock lock(mu_);
  // Too late: the update has written every tile (the caller reads them).
  if (done_so_far && updating_ != version) return 0;
  const Id id = next_++;
  Registration& r = registrations_[id];
  r.version = version;
  r.early = early;
  r.copies = std::move(copies);
  if (done_so_far) {
    // Counted before the snapshot: a tile marked done after the snapshot
    // finds filling_ set when its Fill looks.
    ++filling_;
    r.state = State::kFilling;
    r.done_before = done_so_far();
    if (early) {
      r.written = r.done_before;
      AddWritten(r, 0, 0);
    }
  }
  return id;
}

bool PullFills::WriteCopies(const Registration& r, int64_t elem_bytes, int64_t offset, int64_t n,
                            const std::function<void(int64_t, int64_t, std::byte*)>& round) {
  const int64_t end = offset + n;
  // The first copy that ends past the tile's start.
  auto it = std::partition_point(r.copies.begin(), r.copies.end(),
                                 [&](const Copy& c) { return c.local_offset + c.n <= offset; });
  bool any = false;
  for (; it != r.copies.end() && it->local_offset < end; ++it) {
    const int64_t from = std::max(offset, it->local_offset);
    const int64_t to = std::min(end, it->local_offset + it->n);
    round(from, to - from, it->dst + (from - it->local_offset) * elem_bytes);
    any = true;
  }
  return any;
}

bool PullFills::AddWritten(Registration& r, int64_t offset, int64_t n) {
  if (!r.early || r.whole) return false;
  r.written.Add(offset, offset + n);
  // Copies are sorted: the first one not yet written moves only forward.
  while (r.first_unwritten < r.copies.size()) {
    const Copy& c = r.copies[r.first_unwritten];
    if (!r.written.Contains(c.local_offset, c.local_offset + c.n)) return false;
    ++r.first_unwritten;
  }
  r.whole = true;
  return true;
}

void PullFills::FillAhead(
    int64_t version, int64_t offset, int64_t n,
    const std::function<void(int64_t from, int64_t n, std::byte* dst)>& round) {
  // Shared: the speculation's workers write disjoint tiles at once; a
  // registration's state changes only under the exclusive lock.
  std::shared_lock lock(mu_);
  // After its update began keeping the speculation, what is written ahead
  // is the version's.
  const bool holds = updating_ == version && ahead_holds_;
  for (auto& [id, r] : registrations_) {
    if (r.version != version || !r.Overlaps(offset, n)) continue;
    const bool filling = r.state == State::kFilling && holds;
    if (r.state != State::kWaiting && !filling) continue;
    if (!WriteCopies(r, elem_bytes_, offset, n, round)) continue;
    std::lock_guard hold(*r.ahead_mu);
    r.ahead.Add(offset, offset + n);
    r.written_ahead.Add(offset, offset + n);
    if (filling && AddWritten(r, offset, n)) r.changed->notify_all();
  }
}

void PullFills::ForgetAhead() {
  std::unique_lock lock(mu_);
  for (auto& [id, r] : registrations_) r.ahead.Clear();
}

void PullFills::BeginUpdate(int64_t version, bool ahead_holds) {
  std::unique_lock lock(mu_);
  updating_ = version;
  ahead_holds_ = ahead_holds;
  for (auto& [id, r] : registrations_) {
    if (r.version == version && r.state == State::kWaiting) {
      r.state = State::kFilling;
      if (!ahead_holds) r.ahead.Clear();
      if (r.early) {
        r.written = r.ahead;
        if (AddWritten(r, 0, 0)) r.changed->notify_all();
      }
      ++filling_;
    }
  }
}

void PullFills::Fill(int64_t offset, int64_t n,
                     const std::function<void(int64_t from, int64_t n, std::byte* dst)>& round) {
  if (filling_.load(std::memory_order_acquire) == 0) return;
  std::shared_lock lock(mu_);
  const int64_t end = offset + n;
  for (auto& entry : registrations_) {
    Registration& r = entry.second;  // a lambda below takes it
    // A tile done before the registration is the puller's to read; one
    // written ahead holds this update's bits already.
    if (r.state != State::kFilling || !r.Overlaps(offset, n) ||
        r.done_before.Contains(offset, end) || r.ahead.Contains(offset, end)) {
      continue;
    }
    bool wrote = false;
    if (!r.ahead.Overlaps(offset, end)) {
      wrote = WriteCopies(r, elem_bytes_, offset, n, round);
    } else {
      // Partly written ahead (a tile across a chunk's edge): the rest.
      int64_t at = offset;
      r.ahead.ForEachIn(offset, end, [&](int64_t b, int64_t e) {
        if (b > at) wrote |= WriteCopies(r, elem_bytes_, at, b - at, round);
        at = e;
      });
      if (at < end) wrote |= WriteCopies(r, elem_bytes_, at, end - at, round);
    }
    if (!wrote || !r.early) continue;
    std::lock_guard hold(*r.ahead_mu);
    if (AddWritten(r, offset, n)) r.changed->notify_all();
  }
}

void PullFills::EndUpdate(int64_t version, bool whole) {
  std::unique_lock lock(mu_);
  updating_ = -1;
  ahead_holds_ = false;
  for (auto& [id, r] : registrations_) {
    if (r.version == version && r.state == State::kFilling) {
      r.state = whole ? State::kFilled : State::kUnfilled;
      --filling_;
      r.changed->notify_all();
    }
  }
}

absl::Status PullFills::ReadDoneBefore(
    Id id, const std::function<absl::Status(int64_t from, int64_t n, std::byte* dst)>& read) const {
  std::shared_lock lock(mu_);
  auto it = registrations_.find(id);
  if (it == registrations_.end()) return absl::OkStatus();
  for (const Copy& c : it->second.copies) {
    absl::Status status;
    it->second.done_before.ForEachIn(
        c.local_offset, c.local_offset + c.n, [&](int64_t b, int64_t e) {
          if (status.ok()) {
            status = read(b, e - b, c.dst + (b - c.local_offset) * elem_bytes_);
          }
        });
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

std::optional<int64_t> PullFills::Take(Id id, std::vector<Copy>* written_ahead) {
  if (written_ahead != nullptr) written_ahead->clear();
  std::unique_lock lock(mu_);
  auto it = registrations_.find(id);
  if (it == registrations_.end()) return std::nullopt;
  // (Only a registration made early becomes whole before its update ends.)
  it->second.changed->wait(lock,
                           [&] { return it->second.state != State::kFilling || it->second.whole; });
  const Registration& r = it->second;
  std::optional<int64_t> bytes;
  if (r.state == State::kFilling) --filling_;  // whole before its update ended
  if (r.state == State::kFilled || r.state == State::kFilling) {
    bytes = 0;
    for (const Copy& c : r.copies) *bytes += c.n * elem_bytes_;
  } else if (written_ahead != nullptr) {
    for (const Copy& c : r.copies) {
      r.written_ahead.ForEachIn(c.local_offset, c.local_offset + c.n, [&](int64_t b, int64_t e) {
        written_ahead->push_back({b, e - b, c.dst + (b - c.local_offset) * elem_bytes_});
      });
    }
  }
  registrations_.erase(it);
  return bytes;
}

void PullFills::Withdraw(Id id) {
  std::unique_lock lock(mu_);
  auto it = registrations_.find(id);
  if (it == registrations_.end()) return;
  if (it->second.state == State::kFilling) --filling_;
  registrations_.erase(it);
}

int PullFills::size() const {
  std::shared_lock lock(mu_);
  return static_cast<int>(registrations_.size());
}

}  // namespace zo
