// The swap file of one tiered state: its on-disk slots (swap_layout.h), the
// XXH3-64 checksum of every 64 KiB block held in a RAM table (swap files are
// scratch and live only as long as the process), and the wording of every
// error about them, which names the sub-group, the file and the offset.
//
//   ZO_ASSIGN_OR_RETURN(auto file, SwapFile::Create(layout, "/nvme/job1", true, nullptr));
//   ZO_RETURN_IF_ERROR(engine->RegisterFile(file->fd(), file->path()));
//   if (auto bad = file->VerifyTile(slot, tile, buf)) return file->MismatchError(*bad);
#ifndef ZO_OFFLOAD_TIER_SWAP_FILE_H_
#define ZO_OFFLOAD_TIER_SWAP_FILE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/io/direct_file.h"
#include "offload/io/io_engine.h"
#include "offload/tier/swap_layout.h"

namespace zo {

// The file's name inside the state's directory.
inline constexpr char kSwapFileName[] = "optimizer_state.swap";

// Reserves `bytes` for `file` (DirectFile::Allocate when not replaced: the seam
// for tests of a full disk).
using PreallocateFn = std::function<absl::Status(DirectFile& file, uint64_t bytes)>;

// One block whose bytes do not hash to what was written.
struct ChecksumMismatch {
  int64_t slot = 0;
  int array = 0;  // kStateMaster, kStateM or kStateV
  int64_t tile = 0;
  uint64_t expected = 0;
  uint64_t actual = 0;
};

// Thread-compatible, with one exception: VerifyTile, HashTile and ZeroTile may
// run concurrently on different tiles (the update's workers do).
class SwapFile {
 public:
  // Creates `dir` if missing and locks it (one live state per directory),
  // then creates the file and reserves layout.file_bytes() (a full disk is
  // RESOURCE_EXHAUSTED naming the file, here rather than mid-step). Every
  // slot starts "never written": its state is zero and is not read.
  static absl::StatusOr<std::unique_ptr<SwapFile>> Create(const SwapLayout& layout,
                                                          const std::string& dir, bool checksums,
                                                          const PreallocateFn& preallocate);
  // Closes and removes the file (and the directory when Create made it).
  ~SwapFile();

  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  const SwapLayout& layout() const { return layout_; }
  int fd() const { return file_.fd(); }
  const std::string& path() const { return file_.path(); }
  bool checksums() const { return checksums_; }

  // Whether the slot was ever written; one that was not holds zeros and is
  // filled in RAM instead of read.
  bool written(int64_t slot) const { return written_[slot]; }
  void set_written(int64_t slot) { written_[slot] = true; }

  // Array `array` of a slot held in `buf` (slot_bytes(), 4 KiB-aligned).
  float* Array(char* buf, int array) const {
    return reinterpret_cast<float*>(buf + static_cast<size_t>(array) * layout_.region_bytes());
  }

  // Checks tile `tile` (one block of each array) of slot `slot` held in `buf`
  // against the table; nothing when checksums are off.
  std::optional<ChecksumMismatch> VerifyTile(int64_t slot, int64_t tile, const char* buf) const;
  // Records the checksums of the tile's blocks as they are in `buf` now.
  void HashTile(int64_t slot, int64_t tile, const char* buf);
  // Zeroes the tile's blocks in `buf` (a never-written slot).
  void ZeroTile(int64_t slot, int64_t tile, char* buf) const;
  // Zeroes each region of `buf` past the sub-group's elements.
  void ZeroPadding(int64_t slot, char* buf) const;

  // "sub-group 7 (elements [a, b)), swap slot 2 at offset X of /nvme/job1/...".
  std::string DescribeSlot(int64_t slot) const;
  // DATA_LOSS naming the sub-group, array, block, offset and file.
  absl::Status MismatchError(const ChecksumMismatch& mismatch) const;
  // `status` (a failed read or write of the whole slot) with the slot's
  // context in front; the code is kept.
  absl::Status IoError(int64_t slot, IoOp op, const absl::Status& status) const;

 private:
  SwapFile(const SwapLayout& layout, DirectFile file, int dir_fd, std::string created_dir,
           bool checksums);
  size_t TableIndex(int64_t slot, int array, int64_t tile) const;

  const SwapLayout layout_;
  DirectFile file_;
  const int dir_fd_;               // holds the directory's lock
  const std::string created_dir_;  // Create made it: removed at the end if empty
  const bool checksums_;
  std::vector<uint64_t> sums_;  // [slot][array][tile]; empty without checksums
  std::vector<bool> written_;   // per slot
};

}  // namespace zo

#endif  // ZO_OFFLOAD_TIER_SWAP_FILE_H_
