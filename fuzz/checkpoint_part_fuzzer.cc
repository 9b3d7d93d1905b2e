// One server's checkpoint part, a .zop file (offload/checkpoint/
// checkpoint_part.h, the format in design.md): CheckpointPartReader::Open
// (header, trailer, index), then reads of every chunk it lists, whole and
// in part.
//
// Input, to spend mutations on bytes that matter: the first 16 bytes are
// the header (magic, version, the previous version's element size); the
// 4080 zero bytes that pad it to 4 KiB are
// not in the input; the rest is the file from offset 4096. Before reading,
// the trailer's index checksum is set to the hash of the index it points to,
// so that the index parser sees mutated indexes (a mismatch is checked
// once, first, and is trivially covered).
#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "offload/checkpoint/checkpoint_part.h"

namespace {

constexpr size_t kHeaderInput = 16;
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kTrailerBytes = 40;

std::string* path = nullptr;

uint64_t GetU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian host (the format's)
  return v;
}

void FixIndexChecksum(std::string& file) {
  if (file.size() < kHeaderBytes + kTrailerBytes) return;
  char* trailer = file.data() + file.size() - kTrailerBytes;
  const uint64_t offset = GetU64(trailer);
  const uint64_t bytes = GetU64(trailer + 8);
  if (offset > file.size() || bytes > file.size() - offset) return;
  const uint64_t sum = XXH3_64bits(file.data() + offset, bytes);
  std::memcpy(trailer + 16, &sum, 8);
}

void ReadChunk(const zo::CheckpointPartReader& part, const zo::CheckpointChunk& c) {
  // Whole (the index bounds elems by the file size) and one element short
  // at both ends, so reads start and end inside a block.
  const int64_t n = c.elems;
  std::vector<float> master(static_cast<size_t>(n)), m(master.size()), v(master.size());
  part.Read(c.chunk, 0, absl::MakeSpan(master), absl::MakeSpan(m), absl::MakeSpan(v)).IgnoreError();
  if (n > 2) {
    const size_t k = static_cast<size_t>(n - 2);
    part.Read(c.chunk, 1, {master.data(), k}, {}, {v.data(), k}).IgnoreError();
  }
  part.Read(c.chunk, n, {}, {}, {}).IgnoreError();
  if (part.previous_bytes() > 0) {
    std::vector<char> previous(static_cast<size_t>(n) * part.previous_bytes());
    part.ReadPrevious(c.chunk, 0, n, previous.data()).IgnoreError();
    if (n > 2) part.ReadPrevious(c.chunk, 1, n - 2, previous.data()).IgnoreError();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zo::fuzz::QuietLogs();
  path = new std::string(zo::fuzz::ScratchDir() + "/part-00000.zop");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* in = reinterpret_cast<const char*>(data);
  std::string file(in, std::min(size, kHeaderInput));
  if (size > kHeaderInput) {
    file.resize(kHeaderBytes, '\0');
    file.append(in + kHeaderInput, size - kHeaderInput);
  }
  FixIndexChecksum(file);
  zo::fuzz::WriteFileOrDie(*path, file);
  absl::StatusOr<std::unique_ptr<zo::CheckpointPartReader>> part =
      zo::CheckpointPartReader::Open(*path);
  if (!part.ok()) return 0;
  ZO_FUZZ_CHECK(static_cast<size_t>((*part)->summary().bytes) == file.size(), "summary size");
  const std::vector<zo::CheckpointChunk>& chunks = (*part)->chunks();
  for (size_t i = 0; i < std::min<size_t>(chunks.size(), 8); ++i) ReadChunk(**part, chunks[i]);
  part->reset();
  return 0;
}
