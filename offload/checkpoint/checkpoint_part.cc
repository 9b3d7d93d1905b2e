#include "offload/checkpoint/checkpoint_part.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "offload/checkpoint/durable_file.h"
#include "offload/io/io_error.h"

namespace zo {
namespace {

// The layout is in offload/checkpoint/design.md; integers are little-endian,
// which is also how the floats are stored, so the arrays are copied as is.
static_assert(std::endian::native == std::endian::little,
              "checkpoint parts are little-endian and written as they are in memory");

constexpr char kMagic[8] = {'Z', 'O', 'C', 'K', 'P', 'T', '0', '1'};
// Format 1: master, m, v. Format 2 adds a fourth array per chunk, the
// low-precision weights of the version before the checkpoint's (what a
// resumed delayed-parameter-update step computes on). A part without one is
// written as format 1, byte for byte what builds before format 2 wrote.
constexpr uint32_t kFormatPlain = 1;
constexpr uint32_t kFormatWithPrevious = 2;
constexpr uint64_t kHeaderBytes = 4096;
constexpr uint64_t kAlignBytes = 4096;   // every array starts on a page
constexpr uint64_t kBlockBytes = 65536;  // checksum granularity
constexpr uint64_t kTrailerBytes = 40;   // index offset, length, checksum, version, magic
constexpr int kFloatArrays = 3;
constexpr int kMaxArrays = 4;
constexpr int kPrevious = 3;  // the fourth array's index
constexpr const char* kArrayNames[kMaxArrays] = {"master", "m", "v", "previous"};

alignas(64) constexpr char kZeros[kAlignBytes] = {};

uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }
uint32_t FormatFor(uint32_t previous_bytes) {
  return previous_bytes == 0 ? kFormatPlain : kFormatWithPrevious;
}
// chunk, flat_begin, elems and one file offset per array.
uint64_t EntryFixedBytes(uint32_t format) {
  return 3 * 8 + 8 * (format == kFormatPlain ? kFloatArrays : kMaxArrays);
}

// Where one chunk's arrays lie: in the file (from `first`, the master's
// offset) and in its list of block checksums ([array][block]).
struct ChunkLayout {
  int arrays = kFloatArrays;
  uint64_t bytes[kMaxArrays] = {};      // data bytes of each array
  uint64_t offset[kMaxArrays] = {};     // file offset of each (4 KiB-aligned)
  uint64_t first_sum[kMaxArrays] = {};  // index of its first block checksum
  uint64_t sums = 0;                    // block checksums in all
  uint64_t end = 0;                     // file offset past the last array's padding
};
ChunkLayout LayoutOf(int64_t elems, uint64_t first, uint32_t previous_bytes) {
  ChunkLayout l;
  l.arrays = previous_bytes == 0 ? kFloatArrays : kMaxArrays;
  uint64_t at = first;
  for (int a = 0; a < l.arrays; ++a) {
    l.bytes[a] = static_cast<uint64_t>(elems) * (a == kPrevious ? previous_bytes : sizeof(float));
    l.offset[a] = at;
    l.first_sum[a] = l.sums;
    at += RoundUp(l.bytes[a], kAlignBytes);
    l.sums += RoundUp(l.bytes[a], kBlockBytes) / kBlockBytes;
  }
  l.end = at;
  return l;
}
uint64_t Hash(const char* data, size_t len) { return XXH3_64bits(data, len); }

void PutU64(std::string& out, uint64_t v) {
  char b[8];
  std::memcpy(b, &v, 8);
  out.append(b, 8);
}
void PutU32(std::string& out, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}
uint64_t GetU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
uint32_t GetU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string Hex(uint64_t v) { return absl::StrCat("0x", absl::Hex(v, absl::kZeroPad16)); }

// The header as both writers start the file: magic, format, and from
// format 2 the previous version's element size.
std::string Header(uint32_t previous_bytes) {
  std::string header(kMagic, sizeof(kMagic));
  PutU32(header, FormatFor(previous_bytes));
  if (previous_bytes != 0) PutU32(header, previous_bytes);
  header.resize(kHeaderBytes, '\0');
  return header;
}

// An index entry up to its checksums.
void PutEntryHead(std::string& out, const CheckpointChunk& c, const ChunkLayout& l) {
  PutU64(out, static_cast<uint64_t>(c.chunk));
  PutU64(out, static_cast<uint64_t>(c.flat_begin));
  PutU64(out, static_cast<uint64_t>(c.elems));
  for (int a = 0; a < l.arrays; ++a) PutU64(out, l.offset[a]);
}

// Index (entry count, then `entries`) and trailer for an index starting at
// `index_offset`: the bytes that end the file, and the index checksum.
std::string IndexAndTrailer(uint32_t format, uint64_t count, const std::string& entries,
                            uint64_t index_offset, uint64_t& checksum) {
  std::string tail;
  PutU64(tail, count);
  tail += entries;
  const uint64_t index_bytes = tail.size();
  checksum = Hash(tail.data(), tail.size());
  PutU64(tail, index_offset);
  PutU64(tail, index_bytes);
  PutU64(tail, checksum);
  PutU32(tail, format);
  PutU32(tail, 0);
  tail.append(kMagic, sizeof(kMagic));
  return tail;
}

// fsyncs and closes `fd` (set to -1 either way).
absl::Status SyncAndClose(int& fd, const std::string& path) {
  if (fsync(fd) != 0) {
    const int e = errno;
    close(std::exchange(fd, -1));
    return ZO_ERRNO_STATUS(e, absl::StrCat("fsync checkpoint part ", path));
  }
  if (close(std::exchange(fd, -1)) != 0) {
    return ZO_ERRNO_STATUS(errno, absl::StrCat("close checkpoint part ", path));
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------- writer ---

struct CheckpointPartWriter::Impl {
  std::string path;
  uint32_t previous_bytes = 0;
  int fd = -1;
  uint64_t offset = 0;   // bytes written so far
  uint64_t entries = 0;  // chunks added
  std::string index;     // the entries, serialized as they are added
  int64_t last_chunk = -1;
  absl::Status error;  // sticky: the first failed write
  bool finished = false;

  absl::Status Write(absl::string_view bytes) {
    if (!error.ok()) return error;
    error = WriteAll(fd, bytes, path, offset);
    if (!error.ok()) {
      error =
          absl::Status(error.code(), absl::StrCat("checkpoint part ", path, ": ", error.message()));
      return error;
    }
    offset += bytes.size();
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<CheckpointPartWriter>> CheckpointPartWriter::Create(
    const std::string& path, uint32_t previous_bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ZO_ERRNO_STATUS(errno, absl::StrCat("create checkpoint part ", path));
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->previous_bytes = previous_bytes;
  impl->fd = fd;
  // From here the writer owns the file and removes it on failure.
  std::unique_ptr<CheckpointPartWriter> writer(new CheckpointPartWriter(std::move(impl)));
  ZO_RETURN_IF_ERROR(writer->impl_->Write(Header(previous_bytes)));
  return writer;
}

CheckpointPartWriter::CheckpointPartWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CheckpointPartWriter::~CheckpointPartWriter() {
  if (impl_->fd >= 0) close(impl_->fd);
  if (!impl_->finished) unlink(impl_->path.c_str());
}

absl::Status CheckpointPartWriter::AddChunk(int64_t chunk, int64_t flat_begin,
                                            absl::Span<const float> master,
                                            absl::Span<const float> m, absl::Span<const float> v,
                                            absl::Span<const std::byte> previous) {
  Impl& s = *impl_;
  if (s.finished) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint part ", s.path, " is finished; cannot add chunk ", chunk));
  }
  if (!s.error.ok()) return s.error;
  if (master.empty() || m.size() != master.size() || v.size() != master.size() ||
      previous.size() != master.size() * s.previous_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint part ", s.path, ": chunk ", chunk,
                     " needs master, m and v of one size > 0 and ", s.previous_bytes,
                     " bytes of the previous version per element, got ", master.size(), ", ",
                     m.size(), " and ", v.size(), " elements and ", previous.size(), " bytes"));
  }
  if (chunk <= s.last_chunk || flat_begin < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint part ", s.path, ": chunk ", chunk, " (flat_begin ", flat_begin,
        ") must be >= 0, come after chunk ", s.last_chunk, " and start at a flat index >= 0"));
  }
  const int64_t elems = static_cast<int64_t>(master.size());
  const ChunkLayout l = LayoutOf(elems, s.offset, s.previous_bytes);
  std::string entry;
  PutEntryHead(entry, {chunk, flat_begin, elems}, l);
  const char* arrays[kMaxArrays] = {
      reinterpret_cast<const char*>(master.data()), reinterpret_cast<const char*>(m.data()),
      reinterpret_cast<const char*>(v.data()), reinterpret_cast<const char*>(previous.data())};
  for (int a = 0; a < l.arrays; ++a) {
    for (uint64_t b = 0; b < l.bytes[a]; b += kBlockBytes) {
      PutU64(entry, Hash(arrays[a] + b, std::min(kBlockBytes, l.bytes[a] - b)));
    }
  }
  for (int a = 0; a < l.arrays; ++a) {
    ZO_RETURN_IF_ERROR(s.Write(absl::string_view(arrays[a], l.bytes[a])));
    ZO_RETURN_IF_ERROR(
        s.Write(absl::string_view(kZeros, RoundUp(l.bytes[a], kAlignBytes) - l.bytes[a])));
  }
  s.index += entry;
  ++s.entries;
  s.last_chunk = chunk;
  return absl::OkStatus();
}

absl::StatusOr<CheckpointPartSummary> CheckpointPartWriter::Finish() {
  Impl& s = *impl_;
  if (s.finished) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint part ", s.path, " is already finished"));
  }
  if (!s.error.ok()) return s.error;
  uint64_t checksum = 0;
  ZO_RETURN_IF_ERROR(s.Write(
      IndexAndTrailer(FormatFor(s.previous_bytes), s.entries, s.index, s.offset, checksum)));
  s.error = SyncAndClose(s.fd, s.path);
  if (!s.error.ok()) return s.error;
  s.finished = true;
  return CheckpointPartSummary{BaseName(s.path), static_cast<int64_t>(s.offset), checksum};
}

// ------------------------------------------------------ scattered writer ---

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

// ---------------------------------------------------------------- reader ---

struct CheckpointPartReader::Impl {
  struct Entry {
    std::array<uint64_t, kMaxArrays> offset = {};
    size_t sums = 0;  // first checksum in `sums`: [array][block]
  };
  std::string path;
  int fd = -1;
  uint32_t format = kFormatPlain;
  uint32_t previous_bytes = 0;
  int arrays = kFloatArrays;
  std::vector<CheckpointChunk> chunks;
  std::vector<Entry> entries;
  std::vector<uint64_t> sums;
  CheckpointPartSummary summary;

  absl::Status Corrupt(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat("checkpoint part ", path, ": ", what));
  }
  absl::Status ParseIndex(const std::string& index, uint64_t index_offset);
  // Bytes [begin, begin + len) of array `a` of chunk entry `e` into `dst`.
  absl::Status ReadArray(size_t e, int a, uint64_t begin, uint64_t len, char* dst) const;
};

absl::Status CheckpointPartReader::Impl::ParseIndex(const std::string& index,
                                                    uint64_t index_offset) {
  const char* p = index.data();
  const char* const end = p + index.size();
  if (index.size() < 8) return Corrupt("index shorter than its entry count");
  const uint64_t count = GetU64(p);
  p += 8;
  const uint64_t fixed = EntryFixedBytes(format);
  // Every entry takes at least its fixed part and one checksum per array.
  if (count > index.size() / (fixed + arrays * 8)) {
    return Corrupt(absl::StrCat("index claims ", count, " chunks in ", index.size(), " bytes"));
  }
  for (uint64_t i = 0; i < count; ++i) {
    if (static_cast<uint64_t>(end - p) < fixed) {
      return Corrupt(absl::StrCat("index entry ", i, " is cut short"));
    }
    const CheckpointChunk c{static_cast<int64_t>(GetU64(p)), static_cast<int64_t>(GetU64(p + 8)),
                            static_cast<int64_t>(GetU64(p + 16))};
    Entry entry;
    for (int a = 0; a < arrays; ++a) entry.offset[a] = GetU64(p + 24 + 8 * a);
    p += fixed;
    const int64_t prev = chunks.empty() ? -1 : chunks.back().chunk;
    if (c.chunk <= prev || c.flat_begin < 0 || c.elems <= 0 ||
        static_cast<uint64_t>(c.elems) > index_offset / sizeof(float)) {
      return Corrupt(absl::StrCat("index entry ", i, " (chunk ", c.chunk, ", flat_begin ",
                                  c.flat_begin, ", ", c.elems, " elements) is malformed"));
    }
    // The sizes and checksum counts; the offsets are the file's.
    const ChunkLayout l = LayoutOf(c.elems, kHeaderBytes, previous_bytes);
    for (int a = 0; a < arrays; ++a) {
      const uint64_t off = entry.offset[a];
      if (off < kHeaderBytes || off % kAlignBytes != 0 || off > index_offset ||
          l.bytes[a] > index_offset - off) {
        return Corrupt(absl::StrCat("chunk ", c.chunk, "'s ", kArrayNames[a], " at offset ", off,
                                    " (", l.bytes[a], " bytes) is outside the data area [",
                                    kHeaderBytes, ", ", index_offset, ")"));
      }
    }
    if (static_cast<uint64_t>(end - p) / 8 < l.sums) {
      return Corrupt(absl::StrCat("index entry ", i, " (chunk ", c.chunk, ") is cut short"));
    }
    entry.sums = sums.size();
    for (uint64_t k = 0; k < l.sums; ++k) sums.push_back(GetU64(p + 8 * k));
    p += 8 * l.sums;
    chunks.push_back(c);
    entries.push_back(entry);
  }
  if (p != end) return Corrupt(absl::StrCat("index has ", end - p, " bytes past its last entry"));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CheckpointPartReader>> CheckpointPartReader::Open(
    const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ZO_ERRNO_STATUS(errno, absl::StrCat("open checkpoint part ", path));
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->fd = fd;
  std::unique_ptr<CheckpointPartReader> reader(new CheckpointPartReader(std::move(impl)));
  Impl& s = *reader->impl_;

  struct stat st;
  if (fstat(fd, &st) != 0) return ZO_ERRNO_STATUS(errno, absl::StrCat("fstat ", path));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kHeaderBytes + kTrailerBytes) {
    return s.Corrupt(absl::StrCat("the file is ", size,
                                  " bytes, shorter than a header and a "
                                  "trailer (",
                                  kHeaderBytes + kTrailerBytes, "): truncated"));
  }
  char head[16];
  ZO_RETURN_IF_ERROR(PreadAll(fd, head, sizeof(head), 0, path));
  if (std::memcmp(head, kMagic, sizeof(kMagic)) != 0) {
    return s.Corrupt("bad magic at offset 0: not a zo checkpoint part");
  }
  s.format = GetU32(head + 8);
  if (s.format != kFormatPlain && s.format != kFormatWithPrevious) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint part ", path, " has format version ", s.format,
                     "; this build reads versions ", kFormatPlain, " and ", kFormatWithPrevious));
  }
  if (s.format == kFormatWithPrevious) {
    s.previous_bytes = GetU32(head + 12);
    if (s.previous_bytes != 2 && s.previous_bytes != 4) {
      return s.Corrupt(absl::StrCat("the header gives the previous version ", s.previous_bytes,
                                    "-byte elements; 2 or 4 are written"));
    }
    s.arrays = kMaxArrays;
  }
  char trailer[kTrailerBytes];
  ZO_RETURN_IF_ERROR(PreadAll(fd, trailer, kTrailerBytes, size - kTrailerBytes, path));
  if (std::memcmp(trailer + 32, kMagic, sizeof(kMagic)) != 0) {
    return s.Corrupt(absl::StrCat("bad trailer magic at offset ", size - 8,
                                  ": the file is truncated or was never finished"));
  }
  if (const uint32_t version = GetU32(trailer + 24); version != s.format) {
    return s.Corrupt(
        absl::StrCat("the trailer says format version ", version, ", the header ", s.format));
  }
  const uint64_t index_offset = GetU64(trailer);
  const uint64_t index_bytes = GetU64(trailer + 8);
  const uint64_t checksum = GetU64(trailer + 16);
  if (index_offset < kHeaderBytes || index_offset % kAlignBytes != 0 ||
      index_offset > size - kTrailerBytes || index_bytes != size - kTrailerBytes - index_offset) {
    return s.Corrupt(absl::StrCat("the trailer puts the index at offset ", index_offset, " (",
                                  index_bytes, " bytes), which does not fit the file's ", size,
                                  " bytes: truncated or corrupt"));
  }
  std::string index(index_bytes, '\0');
  ZO_RETURN_IF_ERROR(PreadAll(fd, index.data(), index.size(), index_offset, path));
  if (const uint64_t actual = Hash(index.data(), index.size()); actual != checksum) {
    return s.Corrupt(absl::StrCat("index checksum mismatch: the index at offset ", index_offset,
                                  " (", index_bytes, " bytes) hashes to ", Hex(actual),
                                  ", the trailer says ", Hex(checksum)));
  }
  ZO_RETURN_IF_ERROR(s.ParseIndex(index, index_offset));
  s.summary = CheckpointPartSummary{BaseName(path), static_cast<int64_t>(size), checksum};
  return reader;
}

CheckpointPartReader::CheckpointPartReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CheckpointPartReader::~CheckpointPartReader() {
  if (impl_->fd >= 0) close(impl_->fd);
}

const std::vector<CheckpointChunk>& CheckpointPartReader::chunks() const { return impl_->chunks; }

const CheckpointPartSummary& CheckpointPartReader::summary() const { return impl_->summary; }

// Reads whole 64 KiB blocks so that each can be verified: runs of blocks that
// lie inside `dst` go straight into it, the partial blocks at either end
// through a bounce buffer.
absl::Status CheckpointPartReader::Impl::ReadArray(size_t e, int array, uint64_t b0, uint64_t len,
                                                   char* dst) const {
  const CheckpointChunk& c = chunks[e];
  const ChunkLayout l = LayoutOf(c.elems, kHeaderBytes, previous_bytes);
  const uint64_t base = entries[e].offset[array];
  const uint64_t data_bytes = l.bytes[array];
  const uint64_t b1 = b0 + len;
  const uint64_t* const sums = this->sums.data() + entries[e].sums + l.first_sum[array];
  std::vector<char> bounce;
  auto block_end = [&](uint64_t k) { return std::min((k + 1) * kBlockBytes, data_bytes); };
  auto verify = [&](uint64_t k, const char* data) -> absl::Status {
    const uint64_t n = block_end(k) - k * kBlockBytes;
    const uint64_t actual = Hash(data, n);
    if (actual == sums[k]) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat(
        "checksum mismatch in checkpoint part ", path, ": chunk ", c.chunk, " (flat elements [",
        c.flat_begin, ", ", c.flat_begin + c.elems, ")), ", kArrayNames[array], " block ", k,
        " at file offset ", base + k * kBlockBytes, " (", n, " bytes) hashes to ", Hex(actual),
        ", written as ", Hex(sums[k]), "; the part is corrupt: restore from another checkpoint"));
  };
  auto read_range = [&](char* buf, uint64_t begin, uint64_t end) -> absl::Status {
    absl::Status status = PreadAll(fd, buf, end - begin, base + begin, path);
    if (status.ok()) return status;
    return absl::Status(status.code(), absl::StrCat("read chunk ", c.chunk, " ", kArrayNames[array],
                                                    ": ", status.message()));
  };
  for (uint64_t k = b0 / kBlockBytes; k * kBlockBytes < b1;) {
    const uint64_t begin = k * kBlockBytes;
    if (begin >= b0 && block_end(k) <= b1) {
      uint64_t j = k + 1;  // the run of whole blocks k..j-1
      while (j * kBlockBytes < b1 && block_end(j) <= b1) ++j;
      char* buf = dst + (begin - b0);
      ZO_RETURN_IF_ERROR(read_range(buf, begin, block_end(j - 1)));
      for (uint64_t i = k; i < j; ++i) {
        ZO_RETURN_IF_ERROR(verify(i, buf + (i - k) * kBlockBytes));
      }
      k = j;
      continue;
    }
    bounce.resize(kBlockBytes);
    ZO_RETURN_IF_ERROR(read_range(bounce.data(), begin, block_end(k)));
    ZO_RETURN_IF_ERROR(verify(k, bounce.data()));
    const uint64_t from = std::max(begin, b0);
    const uint64_t to = std::min(block_end(k), b1);
    std::memcpy(dst + (from - b0), bounce.data() + (from - begin), to - from);
    ++k;
  }
  return absl::OkStatus();
}

namespace {

// The chunk's entry, or NOT_FOUND / OUT_OF_RANGE for elements [offset, offset + n).
absl::StatusOr<size_t> FindRange(const std::string& path,
                                 const std::vector<CheckpointChunk>& chunks, int64_t chunk,
                                 int64_t offset, int64_t n) {
  const auto it =
      std::lower_bound(chunks.begin(), chunks.end(), chunk,
                       [](const CheckpointChunk& c, int64_t id) { return c.chunk < id; });
  if (it == chunks.end() || it->chunk != chunk) {
    return absl::NotFoundError(absl::StrCat("checkpoint part ", path, " has no chunk ", chunk));
  }
  if (offset < 0 || offset > it->elems || n > it->elems - offset) {
    return absl::OutOfRangeError(absl::StrCat("checkpoint part ", path, ": elements [", offset,
                                              ", ", offset + n, ") are outside chunk ", chunk,
                                              "'s ", it->elems, " elements"));
  }
  return static_cast<size_t>(it - chunks.begin());
}

}  // namespace

absl::Status CheckpointPartReader::Read(int64_t chunk, int64_t offset, absl::Span<float> master,
                                        absl::Span<float> m, absl::Span<float> v) const {
  const Impl& s = *impl_;
  const std::array<absl::Span<float>, kFloatArrays> outs = {master, m, v};
  size_t n = 0;
  for (const absl::Span<float>& out : outs) n = std::max(n, out.size());
  for (int a = 0; a < kFloatArrays; ++a) {
    if (!outs[a].empty() && outs[a].size() != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint part ", s.path, ": read of chunk ", chunk, " got spans of ", master.size(),
          ", ", m.size(), " and ", v.size(), " elements; each must be empty or of one size"));
    }
  }
  ZO_ASSIGN_OR_RETURN(const size_t e,
                      FindRange(s.path, s.chunks, chunk, offset, static_cast<int64_t>(n)));
  for (int a = 0; a < kFloatArrays; ++a) {
    if (outs[a].empty()) continue;
    ZO_RETURN_IF_ERROR(s.ReadArray(e, a, static_cast<uint64_t>(offset) * sizeof(float),
                                   n * sizeof(float), reinterpret_cast<char*>(outs[a].data())));
  }
  return absl::OkStatus();
}

uint32_t CheckpointPartReader::previous_bytes() const { return impl_->previous_bytes; }

absl::Status CheckpointPartReader::ReadPrevious(int64_t chunk, int64_t offset, int64_t n,
                                                void* out) const {
  const Impl& s = *impl_;
  if (s.previous_bytes == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint part ", s.path, " holds no previous version"));
  }
  ZO_ASSIGN_OR_RETURN(const size_t e, FindRange(s.path, s.chunks, chunk, offset, n));
  if (n == 0) return absl::OkStatus();
  return s.ReadArray(e, kPrevious, static_cast<uint64_t>(offset) * s.previous_bytes,
                     static_cast<uint64_t>(n) * s.previous_bytes, static_cast<char*>(out));
}

}  // namespace zo
