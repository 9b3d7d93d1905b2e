#include "worker/train/weight_file.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "offload/aligned_buffer.h"

namespace zo::train {
absl::Status CheckWeightBuffer(int64_t buffer_elems, const std::string& param, int64_t numel) {
  if (numel <= buffer_elems) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "zero_optimization.offload_param.buffer_size = ", buffer_elems, ": ", param, " has ", numel,
      " parameters, and the pull to NVMe goes through one buffer that must hold the largest "
      "parameter"));
}

std::byte* AlignUp(std::byte* p, int64_t alignment) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  const auto a = static_cast<uintptr_t>(alignment);
  return reinterpret_cast<std::byte*>((at + a - 1) / a * a);
}

absl::StatusOr<std::unique_ptr<WeightFile>> WeightFile::Create(Options options) {
  ZO_RETURN_IF_ERROR(CheckDirectIo(options.dir));
  std::unique_ptr<WeightFile> file(new WeightFile());
  for (const int64_t b : options.param_bytes) {
    file->offsets_.push_back(file->file_bytes_);
    file->bytes_.push_back(b);
    file->file_bytes_ += static_cast<int64_t>(RoundUpTo(static_cast<size_t>(b), kAlignment));
  }
  // One file per stage of this process; the pid keeps processes apart.
  static std::atomic<int> made{0};
  file->path_ = absl::StrCat(options.dir, "/zo-weights-", getpid(), "-", made++, ".bin");
  ZO_ASSIGN_OR_RETURN(file->file_, DirectFile::Open(file->path_, DirectFile::Mode::kCreate));
  if (unlink(file->path_.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot unlink ", file->path_, " after opening it: ", std::strerror(errno)));
  }
  ZO_RETURN_IF_ERROR(file->file_.Allocate(static_cast<uint64_t>(file->file_bytes_)));
  ZO_ASSIGN_OR_RETURN(file->engine_, CreateIoEngine(options.io));
  ZO_RETURN_IF_ERROR(file->engine_->RegisterFile(file->file_.fd(), file->path_));
  file->engine_name_ = std::string(file->engine_->name());
  return file;
}

int64_t WeightFile::RangeBytes(size_t first, size_t last) const {
  if (first >= last) return 0;
  return offsets_[last - 1] +
         static_cast<int64_t>(RoundUpTo(static_cast<size_t>(bytes_[last - 1]), kAlignment)) -
         offsets_[first];
}

absl::Status WeightFile::CheckRange(size_t first, size_t last, const std::byte* buffer) const {
  if (first >= last || last > offsets_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("params [", first, ", ", last, ") of the ", offsets_.size(), " in ", path_));
  }
  if (reinterpret_cast<uintptr_t>(buffer) % kAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a buffer for ", path_, " is not ", kAlignment, "-byte aligned"));
  }
  return absl::OkStatus();
}

absl::Status WeightFile::Write(size_t first, size_t last, const std::byte* buffer) {
  ZO_RETURN_IF_ERROR(CheckRange(first, last, buffer));
  return WriteFully(*engine_, file_.fd(), static_cast<uint64_t>(offsets_[first]), buffer,
                    static_cast<size_t>(RangeBytes(first, last)));
}

absl::Status WeightFile::Read(size_t first, size_t last, std::byte* buffer) {
  ZO_RETURN_IF_ERROR(CheckRange(first, last, buffer));
  return ReadFully(*engine_, file_.fd(), static_cast<uint64_t>(offsets_[first]), buffer,
                   static_cast<size_t>(RangeBytes(first, last)));
}

}  // namespace zo::train
