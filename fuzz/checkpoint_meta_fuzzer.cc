// A checkpoint's commit record, checkpoint.json (offload/checkpoint/
// checkpoint_dir.h), written into a directory that holds the two parts of a
// reference checkpoint (fuzz_support.h): ReadCheckpointMeta, then
// CheckpointReader over the whole flat index space, in odd-sized reads that
// cross chunk and part boundaries.
//
// Invariant: whatever the record says, a read that succeeds returns the
// reference values (the parts are checked against the record).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "offload/checkpoint/checkpoint_dir.h"

namespace {

const zo::testing::FlatState* reference = nullptr;
std::string* dir = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zo::fuzz::QuietLogs();
  reference = new zo::testing::FlatState(zo::fuzz::ReferenceState());
  dir = new std::string(zo::fuzz::ScratchDir());
  zo::fuzz::WriteReferenceParts(*dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zo::fuzz::WriteFileOrDie(*dir + "/checkpoint.json", {reinterpret_cast<const char*>(data), size});
  if (!zo::ReadCheckpointMeta(*dir).ok()) return 0;
  absl::StatusOr<std::unique_ptr<zo::CheckpointReader>> reader = zo::CheckpointReader::Open(*dir);
  if (!reader.ok()) return 0;
  const int64_t total = (*reader)->total_elems();
  const int64_t ref_total = static_cast<int64_t>(reference->master.size());
  constexpr int64_t kStep = 23;  // not a divisor of the chunk size
  std::vector<float> master(kStep), m(kStep), v(kStep);
  for (int64_t at = 0; at < std::min<int64_t>(total, 4 * ref_total); at += kStep) {
    const int64_t n = std::min(kStep, total - at);
    const size_t un = static_cast<size_t>(n);
    if (!(*reader)->ReadFlat(at, {master.data(), un}, {m.data(), un}, {v.data(), un}).ok()) {
      return 0;
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t flat = at + i;
      ZO_FUZZ_CHECK(flat < ref_total, "read past the reference state");
      ZO_FUZZ_CHECK(master[i] == reference->master[flat] && m[i] == reference->m[flat] &&
                        v[i] == reference->v[flat],
                    "a read returned other values than the parts hold");
    }
  }
  return 0;
}
