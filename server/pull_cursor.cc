#include "server/pull_cursor.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cpu_features.h"
#include "common/status_macros.h"
#include "rpc/proto_convert.h"

namespace zo {
namespace {

// ReadInto: a thread per this many elements, at most kMaxReadThreads,
// taking blocks of kReadBlockElems in turn.
constexpr int64_t kElemsPerReadThread = int64_t{4} << 20;
constexpr int64_t kMaxReadThreads = 4;
constexpr int64_t kReadBlockElems = int64_t{256} << 10;

}  // namespace

PullCursor PullCursor::Unchanged(int64_t version, double loss_scale) {
  PullCursor cursor(version, loss_scale);
  cursor.unchanged_ = true;
  return cursor;
}

PullCursor PullCursor::Serving(int64_t version, double loss_scale, DType dtype,
                               ParamVersions::Lease lease, std::vector<Range> ranges) {
  PullCursor cursor(version, loss_scale);
  cursor.dtype_ = dtype;
  cursor.lease_ = std::make_shared<ParamVersions::Lease>(std::move(lease));
  cursor.ranges_ = std::move(ranges);
  return cursor;
}

bool PullCursor::Next(PullPiece* piece) {
  *piece = PullPiece{.version = version_, .loss_scale = loss_scale_, .data = {}, .owner = {}};
  if (unchanged_) {
    if (unchanged_sent_) return false;
    unchanged_sent_ = true;
    piece->unchanged = true;
    return true;
  }
  const Range* next = NextRange();
  if (next == nullptr) return false;
  const Range& r = *next;
  const int64_t elem = static_cast<int64_t>(DTypeSize(dtype_));
  const int64_t len = std::min(kMaxPullPieceBytes / elem, r.elems - done_);
  const auto bytes = static_cast<size_t>(len * elem);
  if (const void* data = lease_->data(); data != nullptr) {
    piece->data = {static_cast<const std::byte*>(data) + (r.local_offset + done_) * elem, bytes};
    piece->owner = lease_;
  } else {
    // Not zeroed: Read writes every byte.
    std::shared_ptr<std::byte[]> copy(new std::byte[bytes]);
    status_ = lease_->Read(r.local_offset + done_, len, copy.get());
    if (!status_.ok()) return false;
    piece->data = {copy.get(), bytes};
    piece->owner = std::move(copy);
  }
  piece->tensor = r.tensor;
  piece->offset = r.tensor_offset + done_;
  piece->dtype = dtype_;
  done_ += len;
  bytes_given_ += len * elem;
  return true;
}

absl::Status PullCursor::ReadInto(InProcessRoute::Place place) {
  if (unchanged_) return absl::OkStatus();
  const int64_t elem = static_cast<int64_t>(DTypeSize(dtype_));
  // Every range placed first (the caller checks each), then read.
  struct Copy {
    int64_t local_offset = 0;
    int64_t n = 0;
    std::byte* dst = nullptr;
  };
  std::vector<Copy> copies;
  int64_t total = 0;
  for (; range_ < ranges_.size(); ++range_, done_ = 0) {
    const Range& r = ranges_[range_];
    const int64_t n = r.elems - done_;
    if (n == 0) continue;
    absl::StatusOr<std::byte*> dst = place({r.tensor, r.tensor_offset + done_, n});
    if (!dst.ok()) return status_ = dst.status();
    copies.push_back({r.local_offset + done_, n, *dst});
    total += n;
  }
  // A big pull is read by several threads: one cannot draw the memory
  // bandwidth a rounding pass wants. They take blocks in turn, so that
  // together they follow an update writing the version (whose reads wait
  // for their ranges) from its first elements to its last.
  const int threads = static_cast<int>(std::clamp<int64_t>(
      total / kElemsPerReadThread, 1, std::min<int64_t>(kMaxReadThreads, HostThreads())));
  const auto* data = static_cast<const std::byte*>(lease_->data());
  auto read_part = [&](int part) -> absl::Status {
    size_t copy = 0;
    int64_t copy_begin = 0;  // the pull's element where copies[copy] starts
    for (int64_t begin = part * kReadBlockElems; begin < total;
         begin += threads * kReadBlockElems) {
      const int64_t end = std::min(total, begin + kReadBlockElems);
      while (copy_begin + copies[copy].n <= begin) copy_begin += copies[copy++].n;
      int64_t at = copy_begin;
      for (size_t k = copy; at < end; at += copies[k++].n) {
        const Copy& c = copies[k];
        const int64_t from = std::max(begin, at), to = std::min(end, at + c.n);
        const int64_t skip = from - at, n = to - from;
        std::byte* dst = c.dst + skip * elem;
        if (data != nullptr) {
          std::memcpy(dst, data + (c.local_offset + skip) * elem, static_cast<size_t>(n * elem));
        } else {
          ZO_RETURN_IF_ERROR(lease_->Read(c.local_offset + skip, n, dst));
        }
      }
    }
    return absl::OkStatus();
  };
  std::vector<absl::Status> results(threads);
  std::vector<std::thread> helpers;
  for (int part = 1; part < threads; ++part) {
    helpers.emplace_back([&, part] { results[part] = read_part(part); });
  }
  results[0] = read_part(0);
  for (std::thread& t : helpers) t.join();
  for (absl::Status& s : results) {
    if (!s.ok()) return status_ = std::move(s);
  }
  bytes_given_ += total * elem;
  return absl::OkStatus();
}

const PullCursor::Range* PullCursor::NextRange() {
  while (range_ < ranges_.size() && done_ == ranges_[range_].elems) {
    ++range_;
    done_ = 0;
  }
  return range_ == ranges_.size() ? nullptr : &ranges_[range_];
}

bool PullCursor::NextInto(absl::Span<std::byte> area, PullPiece* piece, int64_t* area_offset) {
  *piece = PullPiece{.version = version_, .loss_scale = loss_scale_, .data = {}, .owner = {}};
  *area_offset = 0;
  if (unchanged_) return Next(piece);
  const Range* next = NextRange();
  if (next == nullptr) return false;
  const Range& r = *next;
  const int64_t elem = static_cast<int64_t>(DTypeSize(dtype_));
  const int64_t len = std::min(kMaxPullPieceBytes / elem, r.elems - done_);
  const int64_t at = (r.local_offset + done_) * elem;
  if (at + len * elem > static_cast<int64_t>(area.size())) {
    status_ = absl::InvalidArgumentError(absl::StrCat(
        "the shared region's weights area of ", area.size(),
        " bytes cannot hold this server's elements (up to byte ", at + len * elem, ")"));
    return false;
  }
  std::byte* dst = area.data() + at;
  if (already_in_area_) {
    // Written by the update.
  } else if (const void* data = lease_->data(); data != nullptr) {
    std::memcpy(dst, static_cast<const std::byte*>(data) + at, static_cast<size_t>(len * elem));
  } else if (status_ = lease_->Read(r.local_offset + done_, len, dst); !status_.ok()) {
    return false;
  }
  piece->tensor = r.tensor;
  piece->offset = r.tensor_offset + done_;
  piece->dtype = dtype_;
  *area_offset = at;
  done_ += len;
  bytes_given_ += len * elem;
  return true;
}

bool PullCursor::Next(v1::ParamPiece* piece) {
  PullPiece next;
  if (!Next(&next)) return false;
  *piece = ParamPieceHeader(next);
  piece->set_data(reinterpret_cast<const char*>(next.data.data()), next.data.size());
  return true;
}

v1::ParamPiece ParamPieceHeader(const PullPiece& piece) {
  v1::ParamPiece header;
  header.set_version(piece.version);
  header.set_loss_scale(piece.loss_scale);
  if (piece.unchanged) {
    header.set_unchanged(true);
    return header;
  }
  header.set_dtype(DTypeToProto(piece.dtype));
  header.set_tensor(piece.tensor);
  header.set_offset(piece.offset);
  return header;
}

}  // namespace zo
