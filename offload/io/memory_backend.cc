#include "offload/io/memory_backend.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "offload/io/block_io_engine.h"

namespace zo {

void MemoryFiles::Set(int fd, std::string contents) {
  absl::MutexLock lock(&mu_);
  std::string& file = files_[fd];
  used_ = used_ - file.size() + contents.size();
  file = std::move(contents);
}

std::string MemoryFiles::Get(int fd) const {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(fd);
  return it == files_.end() ? std::string() : it->second;
}

void MemoryFiles::set_capacity(size_t bytes) {
  absl::MutexLock lock(&mu_);
  capacity_ = bytes;
}

int64_t MemoryFiles::Read(int fd, uint64_t offset, char* buf, size_t len) const {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(fd);
  if (it == files_.end() || offset >= it->second.size()) return 0;
  const size_t n = std::min<uint64_t>(len, it->second.size() - offset);
  std::memcpy(buf, it->second.data() + offset, n);
  return static_cast<int64_t>(n);
}

int64_t MemoryFiles::Write(int fd, uint64_t offset, const char* buf, size_t len) {
  absl::MutexLock lock(&mu_);
  std::string& file = files_[fd];
  const size_t free_bytes = capacity_ > used_ ? capacity_ - used_ : 0;
  const uint64_t end_max = file.size() + free_bytes;  // furthest this file may reach
  size_t n = len;
  if (offset + len > end_max) {
    n = offset >= end_max ? 0 : (end_max - offset) / kBlockBytes * kBlockBytes;
    n = std::min(n, len);
    if (n == 0) return -ENOSPC;
  }
  if (offset + n > file.size()) {
    used_ += offset + n - file.size();
    file.resize(offset + n);
  }
  std::memcpy(file.data() + offset, buf, n);
  return static_cast<int64_t>(n);
}

namespace {

class MemoryBackend final : public IoBackend {
 public:
  explicit MemoryBackend(MemoryFiles* files) : files_(files) {}

  std::string_view name() const override { return "memory"; }

  void Submit(absl::Span<const IoPiece> pieces) override {
    for (const IoPiece& p : pieces) {
      const int64_t result = p.op == IoOp::kRead ? files_->Read(p.fd, p.offset, p.buf, p.len)
                                                 : files_->Write(p.fd, p.offset, p.buf, p.len);
      done_.push_back({p.id, result});
    }
  }

  absl::Status Wait(size_t min_results, std::vector<IoPieceResult>* out) override {
    if (done_.size() < min_results) {
      return absl::InternalError("memory backend: waiting for more pieces than were submitted");
    }
    out->insert(out->end(), done_.begin(), done_.end());
    done_.clear();
    return absl::OkStatus();
  }

 private:
  MemoryFiles* const files_;
  std::vector<IoPieceResult> done_;
};

}  // namespace

std::unique_ptr<IoBackend> CreateMemoryBackend(MemoryFiles* files) {
  return std::make_unique<MemoryBackend>(files);
}

absl::StatusOr<std::unique_ptr<IoEngine>> CreateMemoryEngine(const IoEngineOptions& options,
                                                             MemoryFiles* files) {
  return NewBlockIoEngine(options, CreateMemoryBackend(files));
}

}  // namespace zo
