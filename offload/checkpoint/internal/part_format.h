// The bytes of a checkpoint part file (offload/checkpoint/design.md), shared
// by its two writers and its reader: the constants, where a chunk's arrays
// lie, and the header, index and trailer encodings. Not for callers outside
// offload/checkpoint/; they use checkpoint_part.h.
//
// Integers are little-endian, which is also how the floats are stored, so the
// arrays are copied as they are in memory.
#ifndef ZO_OFFLOAD_CHECKPOINT_INTERNAL_PART_FORMAT_H_
#define ZO_OFFLOAD_CHECKPOINT_INTERNAL_PART_FORMAT_H_

#include <xxhash.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "offload/checkpoint/checkpoint_part_types.h"

namespace zo::checkpoint_internal {

static_assert(std::endian::native == std::endian::little,
              "checkpoint parts are little-endian and written as they are in memory");

inline constexpr char kMagic[8] = {'Z', 'O', 'C', 'K', 'P', 'T', '0', '1'};
// Format 1: master, m, v. Format 2 adds a fourth array per chunk, the
// low-precision weights of the version before the checkpoint's (what a
// resumed delayed-parameter-update step computes on). A part without one is
// written as format 1, byte for byte what builds before format 2 wrote.
inline constexpr uint32_t kFormatPlain = 1;
inline constexpr uint32_t kFormatWithPrevious = 2;
inline constexpr uint64_t kHeaderBytes = 4096;
inline constexpr uint64_t kAlignBytes = 4096;   // every array starts on a page
inline constexpr uint64_t kBlockBytes = 65536;  // checksum granularity
inline constexpr uint64_t kTrailerBytes = 40;   // index offset, length, checksum, version, magic
inline constexpr int kFloatArrays = 3;
inline constexpr int kMaxArrays = 4;
inline constexpr int kPrevious = 3;  // the fourth array's index
inline constexpr const char* kArrayNames[kMaxArrays] = {"master", "m", "v", "previous"};

inline uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }
inline uint32_t FormatFor(uint32_t previous_bytes) {
  return previous_bytes == 0 ? kFormatPlain : kFormatWithPrevious;
}
// chunk, flat_begin, elems and one file offset per array.
inline uint64_t EntryFixedBytes(uint32_t format) {
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
ChunkLayout LayoutOf(int64_t elems, uint64_t first, uint32_t previous_bytes);

// The checksum of blocks and of the index.
inline uint64_t Hash(const char* data, size_t len) { return XXH3_64bits(data, len); }

inline void PutU64(std::string& out, uint64_t v) {
  char b[8];
  std::memcpy(b, &v, 8);
  out.append(b, 8);
}
inline void PutU32(std::string& out, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}
inline uint64_t GetU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t GetU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The part's file name as the summary lists it: `path` after its last '/'.
std::string BaseName(const std::string& path);

// "0x" and 16 hex digits, as error messages show checksums.
std::string Hex(uint64_t v);

// The header as both writers start the file: magic, format, and from
// format 2 the previous version's element size.
std::string Header(uint32_t previous_bytes);

// An index entry up to its checksums.
void PutEntryHead(std::string& out, const CheckpointChunk& c, const ChunkLayout& l);

// Index (entry count, then `entries`) and trailer for an index starting at
// `index_offset`: the bytes that end the file, and the index checksum.
std::string IndexAndTrailer(uint32_t format, uint64_t count, const std::string& entries,
                            uint64_t index_offset, uint64_t& checksum);

// fsyncs and closes `fd` (set to -1 either way): how both writers finish.
absl::Status SyncAndClose(int& fd, const std::string& path);

}  // namespace zo::checkpoint_internal

#endif  // ZO_OFFLOAD_CHECKPOINT_INTERNAL_PART_FORMAT_H_
