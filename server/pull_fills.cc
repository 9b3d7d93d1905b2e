#include "server/pull_fills.h"

#include <algorithm>
#include <utility>

namespace zo {

PullFills::Id PullFills::Register(int64_t version, std::vector<Copy> copies,
                                  const std::function<RangeSet()>& done_so_far) {
  std::sort(copies.begin(), copies.end(),
            [](const Copy& a, const Copy& b) { return a.local_offset < b.local_offset; });
  std::unique_lock lock(mu_);
  // Too late: the update has written every tile (the caller reads them).
  if (done_so_far && updating_ != version) return 0;
  const Id id = next_++;
  Registration& r = registrations_[id];
  r.version = version;
  r.copies = std::move(copies);
  if (done_so_far) {
    // Counted before the snapshot: a tile marked done after the snapshot
    // finds filling_ set when its Fill looks.
    ++filling_;
    r.state = State::kFilling;
    r.done_before = done_so_far();
  }
  return id;
}

void PullFills::WriteCopies(const Registration& r, int64_t elem_bytes, int64_t offset, int64_t n,
                            const std::function<void(int64_t, int64_t, std::byte*)>& round) {
  const int64_t end = offset + n;
  // The first copy that ends past the tile's start.
  auto it = std::partition_point(r.copies.begin(), r.copies.end(),
                                 [&](const Copy& c) { return c.local_offset + c.n <= offset; });
  for (; it != r.copies.end() && it->local_offset < end; ++it) {
    const int64_t from = std::max(offset, it->local_offset);
    const int64_t to = std::min(end, it->local_offset + it->n);
    round(from, to - from, it->dst + (from - it->local_offset) * elem_bytes);
  }
}

void PullFills::FillAhead(
    int64_t version, int64_t offset, int64_t n,
    const std::function<void(int64_t from, int64_t n, std::byte* dst)>& round) {
  // Shared: the speculation's workers write disjoint tiles at once; a
  // registration's state changes only under the exclusive lock.
  std::shared_lock lock(mu_);
  for (auto& [id, r] : registrations_) {
    if (r.version != version || r.state != State::kWaiting) continue;
    WriteCopies(r, elem_bytes_, offset, n, round);
    std::lock_guard hold(*r.ahead_mu);
    r.ahead.Add(offset, offset + n);
    r.written_ahead.Add(offset, offset + n);
  }
}

void PullFills::ForgetAhead() {
  std::unique_lock lock(mu_);
  for (auto& [id, r] : registrations_) r.ahead.Clear();
}

void PullFills::BeginUpdate(int64_t version, bool ahead_holds) {
  std::unique_lock lock(mu_);
  updating_ = version;
  for (auto& [id, r] : registrations_) {
    if (r.version == version && r.state == State::kWaiting) {
      r.state = State::kFilling;
      if (!ahead_holds) r.ahead.Clear();
      ++filling_;
    }
  }
}

void PullFills::Fill(int64_t offset, int64_t n,
                     const std::function<void(int64_t from, int64_t n, std::byte* dst)>& round) {
  if (filling_.load(std::memory_order_acquire) == 0) return;
  std::shared_lock lock(mu_);
  const int64_t end = offset + n;
  for (const auto& entry : registrations_) {
    const Registration& r = entry.second;  // a lambda below takes it
    // A tile done before the registration is the puller's to read; one
    // written ahead holds this update's bits already.
    if (r.state != State::kFilling || r.done_before.Contains(offset, end) ||
        r.ahead.Contains(offset, end)) {
      continue;
    }
    if (!r.ahead.Overlaps(offset, end)) {
      WriteCopies(r, elem_bytes_, offset, n, round);
      continue;
    }
    // Partly written ahead (a tile across a chunk's edge): the rest.
    int64_t at = offset;
    r.ahead.ForEachIn(offset, end, [&](int64_t b, int64_t e) {
      if (b > at) WriteCopies(r, elem_bytes_, at, b - at, round);
      at = e;
    });
    if (at < end) WriteCopies(r, elem_bytes_, at, end - at, round);
  }
}

void PullFills::EndUpdate(int64_t version, bool whole) {
  std::unique_lock lock(mu_);
  updating_ = -1;
  for (auto& [id, r] : registrations_) {
    if (r.version == version && r.state == State::kFilling) {
      r.state = whole ? State::kFilled : State::kUnfilled;
      --filling_;
    }
  }
  update_ended_.notify_all();
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
  update_ended_.wait(lock, [&] { return it->second.state != State::kFilling; });
  const Registration& r = it->second;
  std::optional<int64_t> bytes;
  if (r.state == State::kFilled) {
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
