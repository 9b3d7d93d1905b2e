#include "server/state_snapshot.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "offload/aligned_buffer.h"

namespace zo {

absl::StatusOr<std::unique_ptr<StateSnapshot>> StateSnapshot::Begin(
    const std::string& path, absl::Span<const LocalChunk> chunks, const ShardMap& map,
    int64_t version, std::shared_ptr<SnapshotStaging> staging, std::optional<Previous> previous) {
  if (previous.has_value() && previous->bytes == 0) {
    return absl::InternalError(
        absl::StrCat("snapshot ", path, ": the previous version to carry has 0-byte elements"));
  }
  std::vector<CheckpointChunk> layout;
  int64_t total = 0;
  for (const LocalChunk& c : chunks) {
    if (c.local_offset != total || c.elems <= 0) {
      return absl::InternalError(absl::StrCat("snapshot ", path, ": chunk ", c.id, " at local ",
                                              c.local_offset, " (", c.elems,
                                              " elements) does not follow the chunks before it"));
    }
    layout.push_back({c.id, map.ChunkRange(c.id).begin, c.elems});
    total += c.elems;
  }
  const uint32_t previous_bytes = previous.has_value() ? previous->bytes : 0;
  ZO_ASSIGN_OR_RETURN(auto writer,
                      ScatteredPartWriter::Create(path, std::move(layout), previous_bytes));
  return std::unique_ptr<StateSnapshot>(
      new StateSnapshot(std::move(writer), std::vector<LocalChunk>(chunks.begin(), chunks.end()),
                        total, version, std::move(staging), std::move(previous)));
}

StateSnapshot::StateSnapshot(std::unique_ptr<ScatteredPartWriter> writer,
                             std::vector<LocalChunk> chunks, int64_t total, int64_t version,
                             std::shared_ptr<SnapshotStaging> staging,
                             std::optional<Previous> previous)
    : writer_(std::move(writer)),
      chunks_(std::move(chunks)),
      total_(total),
      version_(version),
      staging_(std::move(staging)),
      previous_(std::move(previous)),
      uncaptured_(total),
      previous_pending_(previous_.has_value()) {}

absl::Status StateSnapshot::CapturePrevious(bool from_a_step) {
  std::lock_guard previous_lock(previous_mu_);
  if (!previous_.has_value()) {
    std::lock_guard lock(mu_);
    return error_;
  }
  absl::Status written;
  {
    std::lock_guard lock(mu_);
    written = error_;
  }
  const auto* data = static_cast<const char*>(previous_->lease.data());
  // Not stored: recomputed into a buffer a piece at a time.
  constexpr int64_t kPiece = int64_t{1} << 20;
  absl::StatusOr<AlignedBuffer> piece;
  if (data == nullptr) {
    piece = AlignedBuffer::Allocate(static_cast<size_t>(kPiece) * previous_->bytes);
    if (!piece.ok()) written = piece.status();
  }
  for (size_t i = 0; i < chunks_.size() && written.ok(); ++i) {
    const LocalChunk& c = chunks_[i];
    if (data != nullptr) {
      written = writer_->WritePrevious(i, 0, c.elems, data + c.local_offset * previous_->bytes,
                                       /*direct=*/!from_a_step);
      continue;
    }
    for (int64_t at = 0; at < c.elems && written.ok(); at += kPiece) {
      const int64_t n = std::min(kPiece, c.elems - at);
      written = previous_->lease.Read(c.local_offset + at, n, piece->data());
      if (written.ok()) {
        written = writer_->WritePrevious(i, at, n, piece->data(), /*direct=*/!from_a_step);
      }
    }
  }
  previous_.reset();  // the next update may overwrite them now
  {
    std::lock_guard lock(mu_);
    previous_pending_ = false;
    if (!written.ok() && error_.ok()) error_ = written;
    written = error_;
  }
  cv_.notify_all();
  return written;
}

std::pair<int64_t, int64_t> StateSnapshot::NextGapLocked(int64_t from, int64_t end,
                                                         int64_t limit) const {
  int64_t pos = from;
  auto it = captured_.upper_bound(pos);
  if (it != captured_.begin() && std::prev(it)->second > pos) pos = std::prev(it)->second;
  if (pos >= end) return {end, end};
  it = captured_.lower_bound(pos);
  const int64_t gap_end = it == captured_.end() ? end : std::min(end, it->first);
  return {pos, std::min(gap_end, pos + limit)};
}

std::vector<std::pair<int64_t, int64_t>> StateSnapshot::ClaimLocked(int64_t begin, int64_t end) {
  std::vector<std::pair<int64_t, int64_t>> gaps;
  for (int64_t pos = begin; pos < end;) {
    const std::pair<int64_t, int64_t> gap = NextGapLocked(pos, end, end - pos);
    if (gap.first >= end) break;
    gaps.push_back(gap);
    pos = gap.second;
  }
  for (auto [b, e] : gaps) {
    uncaptured_ -= e - b;
    // Gaps touch captured ranges only at their ends: merge with both.
    auto next = captured_.lower_bound(b);
    if (next != captured_.end() && next->first == e) {
      e = next->second;
      next = captured_.erase(next);
    }
    if (next != captured_.begin() && std::prev(next)->second == b) {
      std::prev(next)->second = e;
    } else {
      captured_.emplace(b, e);
    }
  }
  return gaps;
}

absl::Status StateSnapshot::WriteRange(int64_t begin, int64_t end, const float* master,
                                       const float* m, const float* v) {
  auto it = std::upper_bound(chunks_.begin(), chunks_.end(), begin,
                             [](int64_t at, const LocalChunk& c) { return at < c.local_offset; });
  for (size_t i = static_cast<size_t>(std::distance(chunks_.begin(), it)) - 1; begin < end; ++i) {
    const LocalChunk& c = chunks_[i];
    const int64_t n = std::min(end, c.local_offset + c.elems) - begin;
    ZO_RETURN_IF_ERROR(writer_->Write(i, begin - c.local_offset, n, master, m, v));
    begin += n;
    master += n;
    m += n;
    v += n;
  }
  return absl::OkStatus();
}

StateSnapshot::~StateSnapshot() {
  if (staging_ == nullptr) return;
  for (Staged& s : staged_) staging_->Give(std::move(s.data));
}

void StateSnapshot::Capture(int64_t offset, int64_t n, const float* master, const float* m,
                            const float* v, bool stage) {
  std::vector<std::pair<int64_t, int64_t>> gaps;
  {
    std::lock_guard lock(mu_);
    if (!error_.ok()) return;
    gaps = ClaimLocked(std::max<int64_t>(offset, 0), std::min(offset + n, total_));
    in_flight_ += static_cast<int>(gaps.size());
  }
  for (const auto& [b, e] : gaps) {
    const auto k = static_cast<size_t>(e - b);
    const int64_t at = b - offset;
    // A copy costs the step less than the page cache: the writer takes it.
    AlignedBuffer copy;
    if (stage && staging_ != nullptr &&
        3 * StrideFor(static_cast<int64_t>(k)) <= staging_->buffer_floats()) {
      copy = staging_->Take();
    }
    if (copy.data() != nullptr) {
      float* to = copy.as<float>();
      const int64_t stride = StrideFor(static_cast<int64_t>(k));
      std::memcpy(to, master + at, k * sizeof(float));
      std::memcpy(to + stride, m + at, k * sizeof(float));
      std::memcpy(to + 2 * stride, v + at, k * sizeof(float));
      {
        std::lock_guard lock(mu_);
        staged_.push_back({b, e, stride, std::move(copy)});
      }
      cv_.notify_all();
      continue;
    }
    const absl::Status written = WriteRange(b, e, master + at, m + at, v + at);
    {
      std::lock_guard lock(mu_);
      --in_flight_;
      if (!written.ok() && error_.ok()) error_ = written;
    }
    cv_.notify_all();
  }
}

StateObserver StateSnapshot::observer() {
  return [this](int64_t offset, int64_t n, const float* master, const float* m, const float* v) {
    Capture(offset, n, master, m, v, /*stage=*/true);
  };
}

int64_t StateSnapshot::StrideFor(int64_t k) const {
  // Whole pages per array when the buffer has room: the writer can then send
  // each array to the disk directly.
  constexpr int64_t kPageFloats = 4096 / sizeof(float);
  const int64_t padded = (k + kPageFloats - 1) / kPageFloats * kPageFloats;
  return staging_ != nullptr && 3 * padded <= staging_->buffer_floats() ? padded : k;
}

absl::Status StateSnapshot::WriteStaged() {
  // Every copy staged by now at once, so that neighbours go out as one run.
  constexpr size_t kMaxBatch = 256;
  for (;;) {
    std::vector<Staged> batch;
    bool failed;
    {
      std::lock_guard lock(mu_);
      if (staged_.empty()) return error_;
      while (!staged_.empty() && batch.size() < kMaxBatch) {
        batch.push_back(std::move(staged_.front()));
        staged_.pop_front();
      }
      failed = !error_.ok();
    }
    const absl::Status written = failed ? absl::OkStatus() : WriteBatch(batch);
    for (Staged& copy : batch) staging_->Give(std::move(copy.data));
    {
      std::lock_guard lock(mu_);
      in_flight_ -= static_cast<int>(batch.size());
      if (!written.ok() && error_.ok()) error_ = written;
    }
    cv_.notify_all();
  }
}

absl::Status StateSnapshot::WriteBatch(std::vector<Staged>& batch) {
  std::sort(batch.begin(), batch.end(),
            [](const Staged& a, const Staged& b) { return a.begin < b.begin; });
  // Each copy cut at chunk borders; pieces that follow each other in one
  // chunk make a run.
  struct Segment {
    size_t chunk;
    int64_t offset;  // in the chunk
    ScatteredPartWriter::Piece piece;
  };
  std::vector<Segment> segments;
  for (const Staged& copy : batch) {
    const float* data = copy.data.as<float>();
    auto it = std::upper_bound(chunks_.begin(), chunks_.end(), copy.begin,
                               [](int64_t at, const LocalChunk& c) { return at < c.local_offset; });
    size_t i = static_cast<size_t>(std::distance(chunks_.begin(), it)) - 1;
    for (int64_t pos = copy.begin; pos < copy.end; ++i) {
      const LocalChunk& c = chunks_[i];
      const int64_t n = std::min(copy.end, c.local_offset + c.elems) - pos;
      const int64_t at = pos - copy.begin;
      segments.push_back({i,
                          pos - c.local_offset,
                          {n, data + at, data + copy.stride + at, data + 2 * copy.stride + at}});
      pos += n;
    }
  }
  std::vector<ScatteredPartWriter::Piece> run;
  for (size_t j = 0; j < segments.size();) {
    run = {segments[j].piece};
    size_t next = j + 1;
    while (next < segments.size() && segments[next].chunk == segments[j].chunk &&
           segments[next].offset == segments[next - 1].offset + segments[next - 1].piece.n) {
      run.push_back(segments[next].piece);
      ++next;
    }
    ZO_RETURN_IF_ERROR(writer_->WriteRun(segments[j].chunk, segments[j].offset, run));
    j = next;
  }
  return absl::OkStatus();
}

void StateSnapshot::WaitForWork(absl::Time deadline) const {
  std::unique_lock lock(mu_);
  cv_.wait_until(lock, absl::ToChronoTime(deadline),
                 [&] { return !staged_.empty() || CompleteLocked(); });
}

absl::StatusOr<bool> StateSnapshot::CaptureSomeFromRam(TieredOptimizerState& state,
                                                       int64_t max_elems) {
  const int64_t ram_end = std::min(state.ram_elems(), total_);
  max_elems = std::max<int64_t>(max_elems, 1);
  // Into staging buffers while there are free ones: the caller holds the
  // state only for the copy, and WriteStaged writes them later.
  for (int64_t done = 0; staging_ != nullptr && done < max_elems;) {
    std::pair<int64_t, int64_t> gap;
    {
      std::lock_guard lock(mu_);
      ZO_RETURN_IF_ERROR(error_);
      gap = NextGapLocked(0, ram_end, std::min(max_elems - done, staging_->buffer_floats() / 3));
    }
    if (gap.first >= ram_end) break;
    AlignedBuffer buffer = staging_->Take();
    if (buffer.data() == nullptr) break;
    const auto k = static_cast<size_t>(gap.second - gap.first);
    const int64_t stride = StrideFor(static_cast<int64_t>(k));
    float* to = buffer.as<float>();
    if (absl::Status read =
            state.ReadState(gap.first, absl::MakeSpan(to, k), absl::MakeSpan(to + stride, k),
                            absl::MakeSpan(to + 2 * stride, k));
        !read.ok()) {
      staging_->Give(std::move(buffer));
      return read;
    }
    {
      std::lock_guard lock(mu_);
      ClaimLocked(gap.first, gap.second);
      ++in_flight_;
      staged_.push_back({gap.first, gap.second, stride, std::move(buffer)});
    }
    cv_.notify_all();
    done += gap.second - gap.first;
  }
  // Without a free buffer: read and write here.
  std::pair<int64_t, int64_t> gap;
  {
    std::lock_guard lock(mu_);
    ZO_RETURN_IF_ERROR(error_);
    if (!staged_.empty()) return NextGapLocked(0, ram_end, 1).first < ram_end;
    gap = NextGapLocked(0, ram_end, max_elems);
  }
  if (gap.first < ram_end) {
    const auto n = static_cast<size_t>(gap.second - gap.first);
    std::vector<float> master(n), m(n), v(n);
    ZO_RETURN_IF_ERROR(
        state.ReadState(gap.first, absl::MakeSpan(master), absl::MakeSpan(m), absl::MakeSpan(v)));
    Capture(gap.first, gap.second - gap.first, master.data(), m.data(), v.data());
  }
  std::lock_guard lock(mu_);
  ZO_RETURN_IF_ERROR(error_);
  return NextGapLocked(0, ram_end, 1).first < ram_end;
}

absl::Status StateSnapshot::CaptureRest(TieredOptimizerState& state) {
  for (;;) {
    ZO_ASSIGN_OR_RETURN(const bool more, CaptureSomeFromRam(state, int64_t{1} << 22));
    ZO_RETURN_IF_ERROR(WriteStaged());  // frees the buffers the next round takes
    if (!more) break;
  }
  bool left;
  {
    std::lock_guard lock(mu_);
    left = uncaptured_ > 0;
  }
  if (left) {
    ZO_RETURN_IF_ERROR(state.ObserveNvme(
        [this](int64_t offset, int64_t n, const float* master, const float* m, const float* v) {
          Capture(offset, n, master, m, v, /*stage=*/false);
        }));
  }
  ZO_RETURN_IF_ERROR(WriteStaged());
  std::lock_guard lock(mu_);
  ZO_RETURN_IF_ERROR(error_);
  if (uncaptured_ > 0) {
    return absl::InternalError(absl::StrCat("snapshot ", path(), ": ", uncaptured_, " of ", total_,
                                            " elements were never captured"));
  }
  return absl::OkStatus();
}

bool StateSnapshot::complete() const {
  std::lock_guard lock(mu_);
  return CompleteLocked();
}

void StateSnapshot::Abort(absl::Status why) {
  {
    std::lock_guard lock(mu_);
    if (error_.ok()) error_ = std::move(why);
  }
  cv_.notify_all();
  // The lease goes now, not when the last holder of the snapshot lets go:
  // a restore waits for every lease before it resets the versions.
  std::lock_guard previous_lock(previous_mu_);
  previous_.reset();
}

absl::StatusOr<CheckpointPartSummary> StateSnapshot::Finish() {
  {
    std::lock_guard lock(mu_);
    ZO_RETURN_IF_ERROR(error_);
    if (uncaptured_ > 0 || in_flight_ > 0 || previous_pending_) {
      return absl::FailedPreconditionError(
          absl::StrCat("snapshot ", path(), " of version ", version_, ": ", uncaptured_,
                       " elements not captured yet, ", in_flight_, " writes in flight",
                       previous_pending_ ? ", the previous version not written" : ""));
    }
  }
  return writer_->Finish();
}

}  // namespace zo
