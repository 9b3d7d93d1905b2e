#include "offload/checkpoint/checkpoint_reader.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zo {
namespace {

using checkpoint_internal::ChecksumHex;
using checkpoint_internal::kMetaFileName;
using checkpoint_internal::OpenPart;

// A part holds exactly the chunks of its server, with their flat ranges.
absl::Status CheckPartChunks(const CheckpointPartReader& part, const ShardMap& map, int server,
                             const std::string& path) {
  std::vector<CheckpointChunk> want;
  for (int64_t c : map.ChunksOfServer(server)) {
    const FlatRange r = map.ChunkRange(c);
    want.push_back(CheckpointChunk{c, r.begin, r.size()});
  }
  if (part.chunks() == want) return absl::OkStatus();
  auto describe = [](const std::vector<CheckpointChunk>& cs) {
    std::string s = absl::StrCat(cs.size(), " chunks");
    for (size_t i = 0; i < cs.size() && i < 4; ++i) {
      absl::StrAppend(&s, i == 0 ? ": " : ", ", cs[i].chunk, "@", cs[i].flat_begin, "+",
                      cs[i].elems);
    }
    if (cs.size() > 4) absl::StrAppend(&s, ", ...");
    return s;
  };
  return absl::DataLossError(absl::StrCat("checkpoint part ", path, " of server ", server,
                                          " holds ", describe(part.chunks()),
                                          "; the manifest "
                                          "puts ",
                                          describe(want), " there"));
}

}  // namespace

namespace checkpoint_internal {

absl::StatusOr<std::unique_ptr<CheckpointPartReader>> OpenPart(const std::string& dir,
                                                               const CheckpointMeta& meta,
                                                               const ShardMap& map, int server) {
  const CheckpointPartSummary& want = meta.parts[static_cast<size_t>(server)];
  const std::string path = absl::StrCat(dir, "/", want.file);
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointPartReader> part, CheckpointPartReader::Open(path));
  const CheckpointPartSummary& got = part->summary();
  if (got != want) {
    return absl::DataLossError(
        absl::StrCat("checkpoint part ", path, " is ", got.bytes, " bytes with index checksum ",
                     ChecksumHex(got.index_checksum), "; ", kMetaFileName, " lists ", want.bytes,
                     " bytes and ", ChecksumHex(want.index_checksum)));
  }
  ZO_RETURN_IF_ERROR(CheckPartChunks(*part, map, server, path));
  if (part->previous_bytes() != PreviousBytesOf(meta)) {
    return absl::DataLossError(absl::StrCat("checkpoint part ", path, " holds ",
                                            part->previous_bytes(),
                                            " bytes per element of the previous version; ",
                                            kMetaFileName, " says ", PreviousBytesOf(meta)));
  }
  return part;
}

}  // namespace checkpoint_internal

struct CheckpointReader::Impl {
  std::string dir;
  CheckpointMeta meta;
  std::optional<ShardMap> map;
  std::vector<std::unique_ptr<CheckpointPartReader>> parts;  // null until first used

  absl::StatusOr<const CheckpointPartReader*> Part(int server) {
    std::unique_ptr<CheckpointPartReader>& part = parts[static_cast<size_t>(server)];
    if (part == nullptr) {
      ZO_ASSIGN_OR_RETURN(part, OpenPart(dir, meta, *map, server));
    }
    return part.get();
  }
};

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(const std::string& dir) {
  ZO_ASSIGN_OR_RETURN(CheckpointMeta meta, ReadCheckpointMeta(dir));
  ZO_ASSIGN_OR_RETURN(ShardMap map,
                      ShardMap::Create(meta.manifest, meta.chunk_elems, meta.num_servers));
  auto impl = std::make_unique<Impl>();
  impl->dir = dir;
  impl->parts.resize(static_cast<size_t>(meta.num_servers));
  impl->meta = std::move(meta);
  impl->map.emplace(std::move(map));
  return std::unique_ptr<CheckpointReader>(new CheckpointReader(std::move(impl)));
}

CheckpointReader::CheckpointReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointReader::~CheckpointReader() = default;

const CheckpointMeta& CheckpointReader::meta() const { return impl_->meta; }
int64_t CheckpointReader::total_elems() const { return impl_->map->total_elems(); }

absl::Status CheckpointReader::ReadFlat(int64_t flat_begin, absl::Span<float> master,
                                        absl::Span<float> m, absl::Span<float> v) {
  const ShardMap& map = *impl_->map;
  const size_t n = std::max({master.size(), m.size(), v.size()});
  for (const absl::Span<float>* out : {&master, &m, &v}) {
    if (!out->empty() && out->size() != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint ", impl_->dir, ": ReadFlat got spans of ", master.size(), ", ", m.size(),
          " and ", v.size(), " elements; each must be empty or of one size"));
    }
  }
  const int64_t total = map.total_elems();
  if (flat_begin < 0 || flat_begin > total || static_cast<int64_t>(n) > total - flat_begin) {
    return absl::OutOfRangeError(absl::StrCat("checkpoint ", impl_->dir, ": elements [", flat_begin,
                                              ", ", flat_begin + static_cast<int64_t>(n),
                                              ") are outside the job's ", total, " elements"));
  }
  auto piece = [](absl::Span<float> out, size_t pos, size_t len) {
    return out.empty() ? out : out.subspan(pos, len);
  };
  for (size_t done = 0; done < n;) {
    const int64_t pos = flat_begin + static_cast<int64_t>(done);
    const int64_t chunk = pos / map.chunk_elems();
    const FlatRange range = map.ChunkRange(chunk);
    const size_t len =
        static_cast<size_t>(std::min<int64_t>(range.end - pos, static_cast<int64_t>(n - done)));
    ZO_ASSIGN_OR_RETURN(const CheckpointPartReader* part, impl_->Part(map.ServerOfChunk(chunk)));
    ZO_RETURN_IF_ERROR(part->Read(chunk, pos - range.begin, piece(master, done, len),
                                  piece(m, done, len), piece(v, done, len)));
    done += len;
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::ReadPreviousFlat(int64_t flat_begin, int64_t n, void* out) {
  const ShardMap& map = *impl_->map;
  const uint32_t size = PreviousBytesOf(impl_->meta);
  if (size == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", impl_->dir, " holds no previous version's weights"));
  }
  const int64_t total = map.total_elems();
  if (flat_begin < 0 || n < 0 || flat_begin > total || n > total - flat_begin) {
    return absl::OutOfRangeError(absl::StrCat("checkpoint ", impl_->dir, ": elements [", flat_begin,
                                              ", ", flat_begin + n, ") are outside the job's ",
                                              total, " elements"));
  }
  char* dst = static_cast<char*>(out);
  for (int64_t done = 0; done < n;) {
    const int64_t pos = flat_begin + done;
    const int64_t chunk = pos / map.chunk_elems();
    const FlatRange range = map.ChunkRange(chunk);
    const int64_t len = std::min(range.end - pos, n - done);
    ZO_ASSIGN_OR_RETURN(const CheckpointPartReader* part, impl_->Part(map.ServerOfChunk(chunk)));
    ZO_RETURN_IF_ERROR(part->ReadPrevious(chunk, pos - range.begin, len, dst + done * size));
    done += len;
  }
  return absl::OkStatus();
}

}  // namespace zo
