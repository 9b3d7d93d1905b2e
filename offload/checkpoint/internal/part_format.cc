#include "offload/checkpoint/internal/part_format.h"

#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "offload/io/io_error.h"

namespace zo::checkpoint_internal {

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

std::string BaseName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string Hex(uint64_t v) { return absl::StrCat("0x", absl::Hex(v, absl::kZeroPad16)); }

std::string Header(uint32_t previous_bytes) {
  std::string header(kMagic, sizeof(kMagic));
  PutU32(header, FormatFor(previous_bytes));
  if (previous_bytes != 0) PutU32(header, previous_bytes);
  header.resize(kHeaderBytes, '\0');
  return header;
}

void PutEntryHead(std::string& out, const CheckpointChunk& c, const ChunkLayout& l) {
  PutU64(out, static_cast<uint64_t>(c.chunk));
  PutU64(out, static_cast<uint64_t>(c.flat_begin));
  PutU64(out, static_cast<uint64_t>(c.elems));
  for (int a = 0; a < l.arrays; ++a) PutU64(out, l.offset[a]);
}

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

}  // namespace zo::checkpoint_internal
