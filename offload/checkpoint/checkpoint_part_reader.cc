#include "offload/checkpoint/checkpoint_part_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "offload/checkpoint/durable_file.h"
#include "offload/checkpoint/internal/part_format.h"
#include "offload/io/io_error.h"

namespace zo {
namespace {

using checkpoint_internal::BaseName;
using checkpoint_internal::ChunkLayout;
using checkpoint_internal::EntryFixedBytes;
using checkpoint_internal::GetU32;
using checkpoint_internal::GetU64;
using checkpoint_internal::Hash;
using checkpoint_internal::Hex;
using checkpoint_internal::kAlignBytes;
using checkpoint_internal::kArrayNames;
using checkpoint_internal::kBlockBytes;
using checkpoint_internal::kFloatArrays;
using checkpoint_internal::kFormatPlain;
using checkpoint_internal::kFormatWithPrevious;
using checkpoint_internal::kHeaderBytes;
using checkpoint_internal::kMagic;
using checkpoint_internal::kMaxArrays;
using checkpoint_internal::kPrevious;
using checkpoint_internal::kTrailerBytes;
using checkpoint_internal::LayoutOf;

}  // namespace

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
