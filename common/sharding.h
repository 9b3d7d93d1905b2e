// Sharding math (docs/architecture.md, "Sharding"): all tensors of a manifest,
// concatenated in order, form one flat index space that is cut into chunks;
// chunk c lives on server c mod S. A chunk holds `chunk_elems` elements, or
// fewer when the model is small: at most a 1/S share rounded up to
// kChunkAlignElems, so that every server holds a part (a 1M-parameter model
// with the default 4 Mi chunks would otherwise sit wholly on server 0). Pure
// functions of (manifest, chunk_elems, S), so every process computes the same
// map with no lookup service, and a checkpoint can be restored onto another S
// (checkpoints are read by flat range, whatever their chunk size).
#ifndef ZO_COMMON_SHARDING_H_
#define ZO_COMMON_SHARDING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace zo {

// One entry of a job's manifest.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // empty: a scalar (one element)
  DType dtype = DType::kFloat16;
  // Which of the config's parameter groups (zo.param_groups) gives its
  // optimizer hyper-parameters; 0 when the config has none.
  int group = 0;
  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};

// Number of elements of `shape`; 1 for a scalar.
int64_t NumElements(const std::vector<int64_t>& shape);

// A half-open range [begin, end) of the flat index space.
struct FlatRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  friend bool operator==(const FlatRange&, const FlatRange&) = default;
};

// The part of one tensor that falls in one chunk.
struct TensorPiece {
  int tensor = 0;             // index in the manifest
  int64_t chunk = 0;          // chunk id
  int server = 0;             // chunk mod S
  int64_t tensor_offset = 0;  // first element, counted from the tensor's start
  int64_t chunk_offset = 0;   // first element, counted from the chunk's start
  int64_t length = 0;         // elements
  friend bool operator==(const TensorPiece&, const TensorPiece&) = default;
};

// A small model's chunks are cut at a multiple of this: 16 KiB of fp32 state,
// so each chunk's regions of a swap file stay 4 KiB-aligned (O_DIRECT).
inline constexpr int64_t kChunkAlignElems = 4096;

// The chunk size a map of `total_elems` over `num_servers` uses when asked
// for `chunk_elems`: min(chunk_elems, ceil(total / S) rounded up to
// kChunkAlignElems). Applying it to its own result changes nothing.
int64_t EffectiveChunkElems(int64_t total_elems, int64_t chunk_elems, int num_servers);

// Immutable; safe to share between threads.
class ShardMap {
 public:
  // Errors (INVALID_ARGUMENT) on chunk_elems < 1, num_servers < 1, a negative
  // dimension, an empty or duplicate tensor name, or an index space past 2^62.
  // `chunk_elems` is the most elements a chunk holds (EffectiveChunkElems).
  static absl::StatusOr<ShardMap> Create(std::vector<TensorSpec> tensors, int64_t chunk_elems,
                                         int num_servers);

  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  // The chunk size in use: EffectiveChunkElems of the one asked for.
  int64_t chunk_elems() const { return chunk_elems_; }
  int num_servers() const { return num_servers_; }
  int64_t total_elems() const { return total_elems_; }
  int64_t num_chunks() const { return (total_elems_ + chunk_elems_ - 1) / chunk_elems_; }

  // Index of the tensor called `name`, or NOT_FOUND.
  absl::StatusOr<int> TensorIndex(const std::string& name) const;
  // Where tensor `t` sits in the flat space.
  FlatRange TensorRange(int t) const;
  // Flat range of chunk `c` (the last chunk may be short).
  FlatRange ChunkRange(int64_t c) const;
  int ServerOfChunk(int64_t c) const { return static_cast<int>(c % num_servers_); }
  // Which of `stripes` stripes chunk `c` is in: its index among its
  // server's own chunks, modulo stripes. A worker's connections to a
  // server each push and pull one stripe (PullParamsRequest.stripe).
  int StripeOfChunk(int64_t c, int stripes) const {
    return static_cast<int>((c / num_servers_) % stripes);
  }

  // The pieces that tile tensor `t`, in order of tensor offset.
  std::vector<TensorPiece> PiecesOfTensor(int t) const;
  // The pieces of all tensors that tile chunk `c`, in flat order.
  std::vector<TensorPiece> PiecesOfChunk(int64_t c) const;
  // Chunks owned by `server`, ascending.
  std::vector<int64_t> ChunksOfServer(int server) const;
  // Elements owned by `server`.
  int64_t ElemsOnServer(int server) const;

 private:
  ShardMap(std::vector<TensorSpec> tensors, std::vector<int64_t> offsets, int64_t chunk_elems,
           int num_servers);

  std::vector<TensorSpec> tensors_;
  std::vector<int64_t> offsets_;  // tensors_.size() + 1 prefix sums
  int64_t chunk_elems_;
  int num_servers_;
  int64_t total_elems_;
};

}  // namespace zo

#endif  // ZO_COMMON_SHARDING_H_
