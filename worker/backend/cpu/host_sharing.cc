#include "worker/backend/cpu/internal/host_sharing.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace zo::backend::cpu {
namespace {

constexpr absl::string_view kPrefix = "host-memfd:";

// The CPU backend stores every dtype as fp32 (cpu_backend.h).
int64_t StorageBytes(int64_t numel) { return numel * static_cast<int64_t>(sizeof(float)); }

// A shared mapping of `bytes`, unmapped (and its descriptor closed) with it.
class Mapping {
 public:
  Mapping(int fd, std::byte* base, int64_t bytes) : fd_(fd), base_(base), bytes_(bytes) {}
  ~Mapping() {
    munmap(base_, static_cast<size_t>(bytes_));
    close(fd_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  int fd() const { return fd_; }
  std::byte* base() const { return base_; }

 private:
  int fd_;
  std::byte* base_;
  int64_t bytes_;
};

absl::StatusOr<std::unique_ptr<Mapping>> Map(int fd, int64_t bytes, const std::string& what) {
  void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("mapping ", what, " of ", bytes, " bytes: ", std::strerror(err)));
  }
  return std::make_unique<Mapping>(fd, static_cast<std::byte*>(p), bytes);
}

class HostInbox final : public Inbox {
 public:
  HostInbox(Backend& backend, std::unique_ptr<Mapping> mapping, int slots, int64_t slot_bytes)
      : backend_(backend), mapping_(std::move(mapping)), slots_(slots), slot_bytes_(slot_bytes) {
    handle_ = absl::StrCat(kPrefix, getpid(), ":", mapping_->fd(), ":", slots, ":", slot_bytes);
  }

  const std::string& handle() const override { return handle_; }
  int slots() const override { return slots_; }

  absl::StatusOr<Tensor> Take(int slot, DType dtype, const Shape& shape) override {
    const int64_t bytes = StorageBytes(NumElements(shape));
    if (slot < 0 || slot >= slots_ || bytes > slot_bytes_) {
      return absl::DataLossError(absl::StrCat("slot ", slot, " with ", bytes,
                                              " bytes: the inbox has ", slots_, " slots of ",
                                              slot_bytes_, " bytes"));
    }
    Tensor t = backend_.Empty(dtype, shape);
    std::memcpy(t.storage(), mapping_->base() + slot * slot_bytes_, static_cast<size_t>(bytes));
    return t;
  }

 private:
  Backend& backend_;
  std::unique_ptr<Mapping> mapping_;
  const int slots_;
  const int64_t slot_bytes_;
  std::string handle_;
};

class HostPeerInbox final : public PeerInbox {
 public:
  HostPeerInbox(std::unique_ptr<Mapping> mapping, int slots, int64_t slot_bytes)
      : mapping_(std::move(mapping)), slots_(slots), slot_bytes_(slot_bytes) {}

  int slots() const override { return slots_; }
  bool Fits(const Tensor& t) const override { return StorageBytes(t.numel()) <= slot_bytes_; }

  absl::Status Put(int slot, const Tensor& src) override {
    if (slot < 0 || slot >= slots_ || !Fits(src)) {
      return absl::InvalidArgumentError(absl::StrCat("Put of ", src.numel(), " elements into slot ",
                                                     slot, " of ", slots_, " x ", slot_bytes_,
                                                     " bytes"));
    }
    std::memcpy(mapping_->base() + slot * slot_bytes_, src.storage(),
                static_cast<size_t>(StorageBytes(src.numel())));
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Mapping> mapping_;
  const int slots_;
  const int64_t slot_bytes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Inbox>> HostSharing::CreateInbox(int slots, int64_t slot_bytes) {
  if (slots < 1 || slot_bytes < 1 || slot_bytes > (int64_t{1} << 40) / slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("an inbox of ", slots, " slots of ", slot_bytes, " bytes"));
  }
  const int fd = memfd_create("zo-inbox", MFD_CLOEXEC);
  if (fd < 0)
    return absl::ResourceExhaustedError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  // Pages are allocated as the peer first writes them.
  if (ftruncate(fd, slots * slot_bytes) != 0) {
    const int err = errno;
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("sizing the inbox: ", std::strerror(err)));
  }
  auto mapping = Map(fd, slots * slot_bytes, "an inbox");
  if (!mapping.ok()) return mapping.status();
  return std::make_unique<HostInbox>(backend_, *std::move(mapping), slots, slot_bytes);
}

absl::StatusOr<std::unique_ptr<PeerInbox>> HostSharing::OpenPeerInbox(absl::string_view handle) {
  if (!absl::StartsWith(handle, kPrefix)) {
    return absl::FailedPreconditionError("the peer's inbox is not host memory");
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(handle.substr(kPrefix.size()), ':');
  int64_t pid = 0, fd = 0, slots = 0, slot_bytes = 0;
  if (parts.size() != 4 || !absl::SimpleAtoi(parts[0], &pid) || !absl::SimpleAtoi(parts[1], &fd) ||
      !absl::SimpleAtoi(parts[2], &slots) || !absl::SimpleAtoi(parts[3], &slot_bytes) ||
      slots < 1 || slots > 1024 || slot_bytes < 1 || slot_bytes > (int64_t{1} << 40) / slots) {
    return absl::FailedPreconditionError(absl::StrCat("garbled inbox handle '", handle, "'"));
  }
  const std::string path = absl::StrCat("/proc/", pid, "/fd/", fd);
  const int peer_fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (peer_fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("opening the peer's inbox ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(peer_fd, &st) != 0 || st.st_size != slots * slot_bytes) {
    close(peer_fd);
    return absl::FailedPreconditionError(
        absl::StrCat("the peer's inbox ", path, " is not ", slots * slot_bytes, " bytes"));
  }
  auto mapping = Map(peer_fd, slots * slot_bytes, "the peer's inbox");
  if (!mapping.ok()) return absl::FailedPreconditionError(mapping.status().message());
  return std::make_unique<HostPeerInbox>(*std::move(mapping), static_cast<int>(slots), slot_bytes);
}

}  // namespace zo::backend::cpu
