#include "offload/checkpoint/checkpoint_part_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

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
using checkpoint_internal::FormatFor;
using checkpoint_internal::Hash;
using checkpoint_internal::Header;
using checkpoint_internal::IndexAndTrailer;
using checkpoint_internal::kAlignBytes;
using checkpoint_internal::kBlockBytes;
using checkpoint_internal::kMaxArrays;
using checkpoint_internal::LayoutOf;
using checkpoint_internal::PutEntryHead;
using checkpoint_internal::PutU64;
using checkpoint_internal::RoundUp;
using checkpoint_internal::SyncAndClose;

alignas(64) constexpr char kZeros[kAlignBytes] = {};

}  // namespace

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

}  // namespace zo
