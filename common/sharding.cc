#include "common/sharding.h"

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace zo {
namespace {

constexpr int64_t kMaxFlatElems = int64_t{1} << 62;

}  // namespace

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<ShardMap> ShardMap::Create(std::vector<TensorSpec> tensors, int64_t chunk_elems,
                                          int num_servers) {
  if (chunk_elems < 1) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_elems must be >= 1, got ", chunk_elems));
  }
  if (num_servers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the number of servers must be >= 1, got ", num_servers));
  }
  std::vector<int64_t> offsets{0};
  offsets.reserve(tensors.size() + 1);
  std::unordered_set<std::string> names;
  for (const TensorSpec& t : tensors) {
    if (t.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor #", offsets.size() - 1, " of the manifest has an empty name"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name '", t.name, "' appears twice in the manifest"));
    }
    int64_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", t.name, "' has a negative dimension ", d));
      }
      if (d != 0 && n > kMaxFlatElems / d) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' is too large"));
      }
      n *= d;
    }
    if (n > kMaxFlatElems - offsets.back()) {
      return absl::InvalidArgumentError("the manifest has more than 2^62 elements");
    }
    offsets.push_back(offsets.back() + n);
  }
  const int64_t effective = EffectiveChunkElems(offsets.back(), chunk_elems, num_servers);
  return ShardMap(std::move(tensors), std::move(offsets), effective, num_servers);
}

int64_t EffectiveChunkElems(int64_t total_elems, int64_t chunk_elems, int num_servers) {
  const int64_t share = (total_elems + num_servers - 1) / num_servers;
  const int64_t aligned = (share + kChunkAlignElems - 1) / kChunkAlignElems * kChunkAlignElems;
  return std::min(chunk_elems, std::max(aligned, kChunkAlignElems));
}

ShardMap::ShardMap(std::vector<TensorSpec> tensors, std::vector<int64_t> offsets,
                   int64_t chunk_elems, int num_servers)
    : tensors_(std::move(tensors)),
      offsets_(std::move(offsets)),
      chunk_elems_(chunk_elems),
      num_servers_(num_servers),
      total_elems_(offsets_.back()) {}

absl::StatusOr<int> ShardMap::TensorIndex(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].name == name) return static_cast<int>(i);
  }
  return absl::NotFoundError(absl::StrCat("no tensor named '", name, "' in the manifest"));
}

FlatRange ShardMap::TensorRange(int t) const { return {offsets_[t], offsets_[t + 1]}; }

FlatRange ShardMap::ChunkRange(int64_t c) const {
  const int64_t begin = c * chunk_elems_;
  return {begin, std::min(begin + chunk_elems_, total_elems_)};
}

std::vector<TensorPiece> ShardMap::PiecesOfTensor(int t) const {
  std::vector<TensorPiece> pieces;
  const FlatRange r = TensorRange(t);
  for (int64_t pos = r.begin; pos < r.end;) {
    const int64_t chunk = pos / chunk_elems_;
    const int64_t end = std::min(r.end, (chunk + 1) * chunk_elems_);
    pieces.push_back(
        {t, chunk, ServerOfChunk(chunk), pos - r.begin, pos - chunk * chunk_elems_, end - pos});
    pos = end;
  }
  return pieces;
}

std::vector<TensorPiece> ShardMap::PiecesOfChunk(int64_t c) const {
  std::vector<TensorPiece> pieces;
  const FlatRange r = ChunkRange(c);
  // First tensor whose end lies past the chunk's start.
  int t = static_cast<int>(std::upper_bound(offsets_.begin() + 1, offsets_.end(), r.begin) -
                           (offsets_.begin() + 1));
  for (; t < static_cast<int>(tensors_.size()) && offsets_[t] < r.end; ++t) {
    const int64_t begin = std::max(r.begin, offsets_[t]);
    const int64_t end = std::min(r.end, offsets_[t + 1]);
    if (begin >= end) continue;  // empty tensors own nothing
    pieces.push_back({t, c, ServerOfChunk(c), begin - offsets_[t], begin - r.begin, end - begin});
  }
  return pieces;
}

std::vector<int64_t> ShardMap::ChunksOfServer(int server) const {
  std::vector<int64_t> chunks;
  for (int64_t c = server; c < num_chunks(); c += num_servers_) chunks.push_back(c);
  return chunks;
}

int64_t ShardMap::ElemsOnServer(int server) const {
  int64_t n = 0;
  for (int64_t c = server; c < num_chunks(); c += num_servers_) n += ChunkRange(c).size();
  return n;
}

}  // namespace zo
