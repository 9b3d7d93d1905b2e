#include "offload/checkpoint/scattered_part_writer.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "offload/checkpoint/durable_file.h"
#include "offload/checkpoint/internal/part_format.h"
#include "offload/io/io_error.h"

namespace zo {
namespace {

using checkpoint_internal::BaseName;
using checkpoint_internal::ChunkLayout;
using checkpoint_internal::FormatFor;
using checkpoint_internal::Hash;
using checkpoint_internal::Header;
using checkpoint_internal::IndexAndTrailer;
using checkpoint_internal::kAlignBytes;
using checkpoint_internal::kBlockBytes;
using checkpoint_internal::kFloatArrays;
using checkpoint_internal::kHeaderBytes;
using checkpoint_internal::kPrevious;
using checkpoint_internal::LayoutOf;
using checkpoint_internal::PutEntryHead;
using checkpoint_internal::PutU64;
using checkpoint_internal::RoundUp;
using checkpoint_internal::SyncAndClose;

}  // namespace

struct ScatteredPartWriter::Impl {
  std::string path;
  uint32_t previous_bytes = 0;
  int fd = -1;
  // The same file opened O_DIRECT; -1 where the filesystem refuses. Used by
  // the background writer only (WriteRun, WritePrevious with `direct`).
  std::atomic<int> direct_fd{-1};
  std::vector<CheckpointChunk> chunks;
  std::vector<ChunkLayout> layouts;
  uint64_t index_offset = 0;
  // Per chunk, [array][block] as in its layout: the checksums of blocks that
  // one write covered whole, hashed from its memory then (`hashed` 1);
  // Finish reads back only the others. Distinct blocks are written by
  // distinct threads.
  std::vector<std::vector<uint64_t>> sums;
  std::vector<std::vector<uint8_t>> hashed;
  std::mutex mu;
  absl::Status error;  // sticky: the first failed write
  bool finished = false;

  // Hashes the blocks of array `a` that [begin, begin + len) covers whole.
  void HashCovered(size_t index, int a, uint64_t begin, uint64_t len, const char* data);
  // Keeps the first failure; returns it.
  absl::Status Fail(const absl::Status& status);
  // Pieces that follow each other in array `a` of chunks[index] from byte
  // `begin`: hashed, and written with one pwritev, the aligned part with
  // O_DIRECT when `allow_direct` and the filesystem allows it.
  absl::Status WriteArrayRun(size_t index, int a, uint64_t begin, std::vector<iovec> iov,
                             bool allow_direct);
};

absl::StatusOr<std::unique_ptr<ScatteredPartWriter>> ScatteredPartWriter::Create(
    const std::string& path, std::vector<CheckpointChunk> chunks, uint32_t previous_bytes) {
  auto impl = std::make_unique<Impl>();
  uint64_t offset = kHeaderBytes;
  int64_t last = -1;
  for (const CheckpointChunk& c : chunks) {
    if (c.chunk <= last || c.flat_begin < 0 || c.elems <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint part ", path, ": chunk ", c.chunk, " (flat_begin ", c.flat_begin, ", ",
          c.elems, " elements) must have elems > 0 and come after chunk ", last));
    }
    last = c.chunk;
    const ChunkLayout l = LayoutOf(c.elems, offset, previous_bytes);
    impl->layouts.push_back(l);
    offset = l.end;
    impl->sums.emplace_back(l.sums);
    impl->hashed.emplace_back(l.sums);
  }
  impl->index_offset = offset;
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ZO_ERRNO_STATUS(errno, absl::StrCat("create checkpoint part ", path));
  impl->path = path;
  impl->previous_bytes = previous_bytes;
  impl->fd = fd;
  impl->chunks = std::move(chunks);
  std::unique_ptr<ScatteredPartWriter> writer(new ScatteredPartWriter(std::move(impl)));
  ZO_RETURN_IF_ERROR(PwriteAll(fd, Header(previous_bytes), 0, path));
  if (ftruncate(fd, static_cast<off_t>(offset)) != 0) {
    return ZO_ERRNO_STATUS(errno, absl::StrCat("size checkpoint part ", path, " to ", offset));
  }
  writer->impl_->direct_fd = open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
  return writer;
}

ScatteredPartWriter::ScatteredPartWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ScatteredPartWriter::~ScatteredPartWriter() {
  if (const int direct = impl_->direct_fd.exchange(-1); direct >= 0) close(direct);
  if (impl_->fd >= 0) close(impl_->fd);
  if (!impl_->finished) unlink(impl_->path.c_str());
}

const std::vector<CheckpointChunk>& ScatteredPartWriter::chunks() const { return impl_->chunks; }
const std::string& ScatteredPartWriter::path() const { return impl_->path; }
uint32_t ScatteredPartWriter::previous_bytes() const { return impl_->previous_bytes; }

void ScatteredPartWriter::Impl::HashCovered(size_t index, int a, uint64_t begin, uint64_t len,
                                            const char* data) {
  const ChunkLayout& l = layouts[index];
  const uint64_t end = begin + len;
  const uint64_t blocks = RoundUp(l.bytes[a], kBlockBytes) / kBlockBytes;
  for (uint64_t b = RoundUp(begin, kBlockBytes) / kBlockBytes;
       b < blocks && std::min((b + 1) * kBlockBytes, l.bytes[a]) <= end; ++b) {
    const uint64_t n = std::min(kBlockBytes, l.bytes[a] - b * kBlockBytes);
    sums[index][l.first_sum[a] + b] = Hash(data + (b * kBlockBytes - begin), n);
    hashed[index][l.first_sum[a] + b] = 1;
  }
}

absl::Status ScatteredPartWriter::Impl::Fail(const absl::Status& status) {
  std::lock_guard lock(mu);
  if (error.ok()) {
    error =
        absl::Status(status.code(), absl::StrCat("checkpoint part ", path, ": ", status.message()));
  }
  return error;
}

absl::Status ScatteredPartWriter::Write(size_t index, int64_t offset, int64_t n,
                                        const float* master, const float* m, const float* v) {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.mu);
    if (!s.error.ok()) return s.error;
  }
  if (index >= s.chunks.size() || offset < 0 || n <= 0 || offset + n > s.chunks[index].elems) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint part ", s.path, ": elements [", offset, ", ", offset + n,
                     ") of chunk index ", index, " are outside its ", s.chunks.size(), " chunks"));
  }
  const float* arrays[kFloatArrays] = {master, m, v};
  for (int a = 0; a < kFloatArrays; ++a) {
    ZO_RETURN_IF_ERROR(
        s.WriteArrayRun(index, a, static_cast<uint64_t>(offset) * sizeof(float),
                        {{const_cast<float*>(arrays[a]), static_cast<size_t>(n) * sizeof(float)}},
                        /*allow_direct=*/false));
  }
  return absl::OkStatus();
}

absl::Status ScatteredPartWriter::WritePrevious(size_t index, int64_t offset, int64_t n,
                                                const void* data, bool direct) {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.mu);
    if (!s.error.ok()) return s.error;
  }
  if (s.previous_bytes == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint part ", s.path, " was created without a previous version to write"));
  }
  if (index >= s.chunks.size() || offset < 0 || n <= 0 || offset + n > s.chunks[index].elems) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint part ", s.path, ": previous-version elements [", offset, ", ", offset + n,
        ") of chunk index ", index, " are outside its ", s.chunks.size(), " chunks"));
  }
  return s.WriteArrayRun(index, kPrevious, static_cast<uint64_t>(offset) * s.previous_bytes,
                         {{const_cast<void*>(data), static_cast<size_t>(n) * s.previous_bytes}},
                         direct);
}

bool ScatteredPartWriter::writes_direct() const { return impl_->direct_fd >= 0; }

namespace {

bool PageAligned(uint64_t x) { return x % kAlignBytes == 0; }
bool PageAligned(const void* p) { return PageAligned(reinterpret_cast<uintptr_t>(p)); }

// pwritev until every byte of `iov` is written (short writes go on from
// where they stopped).
absl::Status PwritevAll(int fd, std::vector<iovec> iov, uint64_t offset, const std::string& path) {
  size_t first = 0;
  while (first < iov.size()) {
    const int count = static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
    const ssize_t n = pwritev(fd, iov.data() + first, count, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ZO_ERRNO_STATUS(errno, absl::StrCat("write ", path, " at offset ", offset));
    }
    if (n == 0) return absl::DataLossError(absl::StrCat("write ", path, " made no progress"));
    offset += static_cast<uint64_t>(n);
    for (size_t left = static_cast<size_t>(n); left > 0;) {
      const size_t take = std::min(left, iov[first].iov_len);
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + take;
      iov[first].iov_len -= take;
      left -= take;
      if (iov[first].iov_len == 0) ++first;
    }
    while (first < iov.size() && iov[first].iov_len == 0) ++first;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ScatteredPartWriter::Impl::WriteArrayRun(size_t index, int a, uint64_t begin,
                                                      std::vector<iovec> iov, bool allow_direct) {
  const uint64_t at = layouts[index].offset[a] + begin;
  // O_DIRECT takes whole aligned pages: every piece but the last must be
  // whole pages in aligned memory, and the run must start on a page.
  bool direct = allow_direct && direct_fd >= 0 && PageAligned(at);
  uint64_t pos = begin;
  for (size_t i = 0; i < iov.size(); ++i) {
    const char* data = static_cast<const char*>(iov[i].iov_base);
    HashCovered(index, a, pos, iov[i].iov_len, data);
    pos += iov[i].iov_len;
    direct = direct && PageAligned(data) && (i + 1 == iov.size() || PageAligned(iov[i].iov_len));
  }
  uint64_t rest_at = at;  // what O_DIRECT leaves goes through the page cache
  if (direct) {
    const std::vector<iovec> all = iov;
    const iovec last = iov.back();
    const uint64_t whole = last.iov_len / kAlignBytes * kAlignBytes;
    iov.back().iov_len = whole;
    if (whole == 0) iov.pop_back();
    uint64_t direct_bytes = 0;
    for (const iovec& v : iov) direct_bytes += v.iov_len;
    absl::Status written =
        direct_bytes > 0 ? PwritevAll(direct_fd, iov, at, path) : absl::OkStatus();
    iov.clear();
    if (absl::IsInvalidArgument(written)) {
      // A filesystem that opens O_DIRECT but refuses these writes: the page
      // cache from now on, and for all of this run.
      ZO_LOG(WARNING) << "checkpoint part " << path << ": O_DIRECT writes refused ("
                      << written.message() << "); writing through the page cache";
      close(direct_fd.exchange(-1));
      iov = all;
    } else if (!written.ok()) {
      return Fail(written);
    } else {
      rest_at = at + direct_bytes;
      if (last.iov_len > whole) {
        iov.push_back({static_cast<char*>(last.iov_base) + whole, last.iov_len - whole});
      }
    }
  }
  if (!iov.empty()) {
    absl::Status written = PwritevAll(fd, std::move(iov), rest_at, path);
    if (!written.ok()) return Fail(written);
  }
  return absl::OkStatus();
}

absl::Status ScatteredPartWriter::WriteRun(size_t index, int64_t offset,
                                           absl::Span<const Piece> pieces) {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.mu);
    if (!s.error.ok()) return s.error;
  }
  int64_t total = 0;
  for (const Piece& p : pieces) {
    if (p.n <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint part ", s.path, ": a run has a piece of ", p.n, " elements"));
    }
    total += p.n;
  }
  if (index >= s.chunks.size() || offset < 0 || offset + total > s.chunks[index].elems) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint part ", s.path, ": elements [", offset, ", ", offset + total,
                     ") of chunk index ", index, " are outside its ", s.chunks.size(), " chunks"));
  }
  const uint64_t begin = static_cast<uint64_t>(offset) * sizeof(float);
  for (int a = 0; a < kFloatArrays; ++a) {
    std::vector<iovec> iov;
    for (const Piece& p : pieces) {
      const float* data = a == 0 ? p.master : a == 1 ? p.m : p.v;
      iov.push_back({const_cast<float*>(data), static_cast<size_t>(p.n) * sizeof(float)});
    }
    ZO_RETURN_IF_ERROR(s.WriteArrayRun(index, a, begin, std::move(iov), /*direct=*/true));
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointPartSummary> ScatteredPartWriter::Finish() {
  Impl& s = *impl_;
  if (s.finished) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint part ", s.path, " is already finished"));
  }
  {
    std::lock_guard lock(s.mu);
    if (!s.error.ok()) return s.error;
  }
  // Blocks no single write covered are read back (from the page cache,
  // mostly) to hash them.
  std::string entries;
  std::vector<char> block(kBlockBytes);
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    const ChunkLayout& l = s.layouts[i];
    PutEntryHead(entries, s.chunks[i], l);
    for (int a = 0; a < l.arrays; ++a) {
      for (uint64_t at = 0, k = l.first_sum[a]; at < l.bytes[a]; at += kBlockBytes, ++k) {
        if (s.hashed[i][k]) {
          PutU64(entries, s.sums[i][k]);
          continue;
        }
        const size_t len = std::min(kBlockBytes, l.bytes[a] - at);
        ZO_RETURN_IF_ERROR(PreadAll(s.fd, block.data(), len, l.offset[a] + at, s.path));
        PutU64(entries, Hash(block.data(), len));
      }
    }
  }
  uint64_t checksum = 0;
  const std::string tail = IndexAndTrailer(FormatFor(s.previous_bytes), s.chunks.size(), entries,
                                           s.index_offset, checksum);
  ZO_RETURN_IF_ERROR(PwriteAll(s.fd, tail, s.index_offset, s.path));
  if (const int direct = s.direct_fd.exchange(-1); direct >= 0) close(direct);
  ZO_RETURN_IF_ERROR(SyncAndClose(s.fd, s.path));
  s.finished = true;
  return CheckpointPartSummary{BaseName(s.path), static_cast<int64_t>(s.index_offset + tail.size()),
                               checksum};
}

}  // namespace zo
