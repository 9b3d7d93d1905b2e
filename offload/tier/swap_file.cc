#include "offload/tier/swap_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "offload/io/io_error.h"

namespace zo {
namespace {

// Zeros to hash: the checksum of a never-written block.
alignas(64) const char kZeros[kChecksumBlockBytes] = {};

uint64_t Hash(const char* data, size_t len) { return XXH3_64bits(data, len); }

// Creates `dir` when missing; returns whether this call made it.
absl::StatusOr<bool> MakeDir(const std::string& dir) {
  std::error_code ec;
  const bool made = std::filesystem::create_directories(dir, ec);
  if (ec) return ZO_ERRNO_STATUS(ec.value(), absl::StrCat("create swap directory ", dir));
  return made;
}

// An fd of `dir` holding an exclusive lock: two states sharing a directory
// would truncate each other's swap file.
absl::StatusOr<int> LockDir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ZO_ERRNO_STATUS(errno, absl::StrCat("open swap directory ", dir));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    close(fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat(
          "swap directory ", dir, " is in use by another optimizer state (one directory per job)"));
    }
    return ZO_ERRNO_STATUS(err, absl::StrCat("lock swap directory ", dir));
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SwapFile>> SwapFile::Create(const SwapLayout& layout,
                                                           const std::string& dir, bool checksums,
                                                           const PreallocateFn& preallocate) {
  ZO_ASSIGN_OR_RETURN(const bool made_dir, MakeDir(dir));
  absl::StatusOr<int> dir_fd = LockDir(dir);
  if (!dir_fd.ok()) {
    if (made_dir) rmdir(dir.c_str());
    return dir_fd.status();
  }
  // From here the object owns the lock and removes what it made.
  const std::string path = absl::StrCat(dir, "/", kSwapFileName);
  absl::StatusOr<DirectFile> file = DirectFile::Open(path, DirectFile::Mode::kCreate);
  if (!file.ok()) {
    close(*dir_fd);
    if (made_dir) rmdir(dir.c_str());
    return file.status();
  }
  std::unique_ptr<SwapFile> swap(
      new SwapFile(layout, *std::move(file), *dir_fd, made_dir ? dir : "", checksums));
  const uint64_t bytes = layout.file_bytes();
  absl::Status reserved =
      preallocate ? preallocate(swap->file_, bytes) : swap->file_.Allocate(bytes);
  if (!reserved.ok()) {
    return absl::Status(
        reserved.code(),
        absl::StrCat("swap file ", path, ": cannot reserve ", bytes, " bytes for ",
                     layout.nvme_sub_groups(), " sub-groups of ", layout.slot_bytes(),
                     " bytes (is the disk full?): ", reserved.message()));
  }
  return swap;
}

SwapFile::SwapFile(const SwapLayout& layout, DirectFile file, int dir_fd, std::string created_dir,
                   bool checksums)
    : layout_(layout),
      file_(std::move(file)),
      dir_fd_(dir_fd),
      created_dir_(std::move(created_dir)),
      checksums_(checksums),
      written_(static_cast<size_t>(layout.nvme_sub_groups()), false) {
  if (!checksums_) return;
  const int64_t slots = layout_.nvme_sub_groups();
  sums_.assign(static_cast<size_t>(slots * kStateArrays * layout_.blocks_per_region()), 0);
  const uint64_t full = Hash(kZeros, kChecksumBlockBytes);
  for (int64_t slot = 0; slot < slots; ++slot) {
    const int64_t sg = layout_.sub_group_of_slot(slot);
    for (int64_t tile = 0; tile < layout_.tiles(sg); ++tile) {
      const size_t len = layout_.block_bytes(sg, tile);
      const uint64_t sum = len == kChecksumBlockBytes ? full : Hash(kZeros, len);
      for (int a = 0; a < kStateArrays; ++a) sums_[TableIndex(slot, a, tile)] = sum;
    }
  }
}

SwapFile::~SwapFile() {
  const std::string path = file_.path();
  (void)file_.Close();
  unlink(path.c_str());
  close(dir_fd_);
  if (!created_dir_.empty()) rmdir(created_dir_.c_str());
}

size_t SwapFile::TableIndex(int64_t slot, int array, int64_t tile) const {
  return static_cast<size_t>((slot * kStateArrays + array) * layout_.blocks_per_region() + tile);
}

std::optional<ChecksumMismatch> SwapFile::VerifyTile(int64_t slot, int64_t tile,
                                                     const char* buf) const {
  if (!checksums_) return std::nullopt;
  const int64_t sg = layout_.sub_group_of_slot(slot);
  const size_t len = layout_.block_bytes(sg, tile);
  for (int a = 0; a < kStateArrays; ++a) {
    const char* block = buf + a * layout_.region_bytes() + tile * kChecksumBlockBytes;
    const uint64_t actual = Hash(block, len);
    const uint64_t expected = sums_[TableIndex(slot, a, tile)];
    if (actual != expected) return ChecksumMismatch{slot, a, tile, expected, actual};
  }
  return std::nullopt;
}

void SwapFile::HashTile(int64_t slot, int64_t tile, const char* buf) {
  if (!checksums_) return;
  const int64_t sg = layout_.sub_group_of_slot(slot);
  const size_t len = layout_.block_bytes(sg, tile);
  for (int a = 0; a < kStateArrays; ++a) {
    const char* block = buf + a * layout_.region_bytes() + tile * kChecksumBlockBytes;
    sums_[TableIndex(slot, a, tile)] = Hash(block, len);
  }
}

void SwapFile::ZeroTile(int64_t slot, int64_t tile, char* buf) const {
  const size_t len = layout_.block_bytes(layout_.sub_group_of_slot(slot), tile);
  for (int a = 0; a < kStateArrays; ++a) {
    std::memset(buf + a * layout_.region_bytes() + tile * kChecksumBlockBytes, 0, len);
  }
}

void SwapFile::ZeroPadding(int64_t slot, char* buf) const {
  const size_t used =
      static_cast<size_t>(layout_.size(layout_.sub_group_of_slot(slot))) * sizeof(float);
  for (int a = 0; a < kStateArrays; ++a) {
    std::memset(buf + a * layout_.region_bytes() + used, 0, layout_.region_bytes() - used);
  }
}

std::string SwapFile::DescribeSlot(int64_t slot) const {
  return absl::StrCat(layout_.DescribeSubGroup(layout_.sub_group_of_slot(slot)), ", swap slot ",
                      slot, " at offset ", layout_.slot_offset(slot), " of ", path());
}

absl::Status SwapFile::MismatchError(const ChecksumMismatch& m) const {
  const int64_t sg = layout_.sub_group_of_slot(m.slot);
  const uint64_t offset =
      layout_.region_offset(m.slot, m.array) + static_cast<uint64_t>(m.tile) * kChecksumBlockBytes;
  return absl::DataLossError(absl::StrCat(
      "checksum mismatch in ", layout_.DescribeSubGroup(sg), ": the ", StateArrayName(m.array),
      " block ", m.tile, " at offset ", offset, " (", layout_.block_bytes(sg, m.tile),
      " bytes) of ", path(), " hashes to 0x", absl::Hex(m.actual, absl::kZeroPad16),
      ", written as 0x", absl::Hex(m.expected, absl::kZeroPad16),
      "; the swap file is corrupt: restore the state from a checkpoint"));
}

absl::Status SwapFile::IoError(int64_t slot, IoOp op, const absl::Status& status) const {
  return absl::Status(status.code(), absl::StrCat(IoOpName(op), " of ", DescribeSlot(slot),
                                                  " failed: ", status.message()));
}

}  // namespace zo
