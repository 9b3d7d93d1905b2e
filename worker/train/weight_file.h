// The 16-bit weights of a stage that streams its parameters with
// zero_optimization.offload_param.device "nvme": kept in a file under
// nvme_path instead of host memory, moved with O_DIRECT through the NVMe
// tier's I/O engine (offload/io/io_engine.h: io_uring, else a pread pool).
//
// Each param starts at a 4 KiB-aligned offset, in stage order, so params
// [first, last) are one aligned range of the file, written from or read
// into one aligned buffer laid out as the file is (param i at
// offset(i) - offset(first)). The file is unlinked once it is open: it
// lives as long as the process holds it, and a crash leaves nothing behind.
//
//   ZO_ASSIGN_OR_RETURN(auto file, WeightFile::Create({.dir = nvme_path, .param_bytes = sizes}));
//   ZO_RETURN_IF_ERROR(file->Write(0, 3, buffer));  // buffer: RangeBytes(0, 3), 4 KiB-aligned
//
// Thread-compatible: one thread at a time (the stage's).
#ifndef ZO_WORKER_TRAIN_WEIGHT_FILE_H_
#define ZO_WORKER_TRAIN_WEIGHT_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/io/direct_file.h"
#include "offload/io/io_engine.h"

namespace zo::train {

class WeightFile {
 public:
  static constexpr int64_t kAlignment = 4096;  // O_DIRECT's rule for offset, length and buffer

  struct Options {
    std::string dir;  // must take O_DIRECT files (CheckDirectIo)
    IoEngineOptions io;
    std::vector<int64_t> param_bytes;  // in stage order
  };
  // FAILED_PRECONDITION naming the directory and its filesystem when it
  // cannot take O_DIRECT files; RESOURCE_EXHAUSTED naming the file when the
  // disk cannot hold it.
  static absl::StatusOr<std::unique_ptr<WeightFile>> Create(Options options);

  size_t params() const { return offsets_.size(); }
  int64_t offset(size_t i) const { return offsets_[i]; }
  int64_t bytes(size_t i) const { return bytes_[i]; }
  // The aligned length of params [first, last) in the file.
  int64_t RangeBytes(size_t first, size_t last) const;
  int64_t file_bytes() const { return file_bytes_; }
  // Where the file was made (it has no name once open), for messages.
  const std::string& path() const { return path_; }
  const std::string& engine() const { return engine_name_; }

  // Params [first, last) from or into `buffer` (kAlignment-aligned,
  // RangeBytes(first, last) bytes). Errors name the file.
  absl::Status Write(size_t first, size_t last, const std::byte* buffer);
  absl::Status Read(size_t first, size_t last, std::byte* buffer);

 private:
  WeightFile() = default;
  absl::Status CheckRange(size_t first, size_t last, const std::byte* buffer) const;

  std::vector<int64_t> offsets_;
  std::vector<int64_t> bytes_;
  int64_t file_bytes_ = 0;
  std::string path_;
  std::string engine_name_;
  DirectFile file_;
  std::unique_ptr<IoEngine> engine_;
};

// INVALID_ARGUMENT naming the key and the param when one of `numel`
// parameters does not fit the pull's buffer of offload_param.buffer_size.
absl::Status CheckWeightBuffer(int64_t buffer_elems, const std::string& param, int64_t numel);

// `p` rounded up to a multiple of `alignment`: O_DIRECT buffers carved from
// Backend::AllocateHost's memory (page-locked where the backend has it),
// allocated alignment - 1 bytes larger.
std::byte* AlignUp(std::byte* p, int64_t alignment);

}  // namespace zo::train

#endif  // ZO_WORKER_TRAIN_WEIGHT_FILE_H_
