#include "server/shared_regions.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/shared_futex.h"
#include "rpc/error_detail.h"

namespace zo {

SharedRegion::~SharedRegion() { munmap(base_, static_cast<size_t>(bytes_)); }

absl::StatusOr<absl::Span<std::byte>> SharedRegion::Range(int64_t offset, int64_t n) const {
  // As lengths, so that no sum can overflow.
  if (offset < 0 || n < 0 || offset > bytes_ || n > bytes_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes [", offset, ", +", n, ") are not inside the shared region of ", bytes_, " bytes"));
  }
  return absl::Span<std::byte>(base_ + offset, static_cast<size_t>(n));
}

absl::StatusOr<uint32_t*> SharedRegion::AckSlot(int64_t offset) const {
  constexpr int64_t kSlotBytes = 2 * sizeof(uint32_t);
  if (offset < 0 || offset % kSlotBytes != 0 || offset > bytes_ - kSlotBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("acknowledgement slot at byte ", offset, ": not a multiple of ", kSlotBytes,
                     " inside the shared region of ", bytes_, " bytes"));
  }
  return reinterpret_cast<uint32_t*>(base_ + offset);
}

void SharedRegion::Acknowledge(uint32_t* slot, uint32_t ack) {
  std::atomic_ref<uint32_t> word(slot[0]);
  uint32_t seen = word.load();
  // A later acknowledgement is kept: the worker waits for "at least".
  while (static_cast<int32_t>(ack - seen) > 0 && !word.compare_exchange_weak(seen, ack)) {
  }
  // Sequentially consistent with the worker's count-then-look: either it
  // sees the store, or this sees its count and wakes it.
  if (std::atomic_ref<uint32_t>(slot[1]).load() != 0) SharedFutexWakeAll(slot);
}

std::string HostBootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return std::string(absl::StripAsciiWhitespace(id));
}

void SharedRegions::SweepLocked() {
  for (auto it = regions_.begin(); it != regions_.end();) {
    if (kill(static_cast<pid_t>(it->second->pid()), 0) != 0 && errno == ESRCH) {
      it = regions_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<uint64_t> SharedRegions::Attach(const v1::AttachRegionRequest& request) {
  if (!enabled_) {
    return absl::FailedPreconditionError(
        "this server takes no shared memory (zo-server --shared-memory=false)");
  }
  const std::string boot_id = HostBootId();
  if (request.boot_id().empty() || request.boot_id() != boot_id) {
    return absl::FailedPreconditionError(absl::StrCat("the worker is on another host (boot id '",
                                                      request.boot_id(), "', this host's '",
                                                      boot_id, "')"));
  }
  if (request.pid() <= 0 || request.fd() < 0 || request.bytes() <= 0 ||
      request.bytes() > (int64_t{1} << 44)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no region: pid ", request.pid(), ", fd ", request.fd(), ", ", request.bytes(), " bytes"));
  }
  const std::string path = absl::StrCat("/proc/", request.pid(), "/fd/", request.fd());
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot open the worker's region ", path,
                                                      ": ", std::strerror(errno),
                                                      " (another user, or another pid namespace)"));
  }
  struct stat st {};
  const int seals = fcntl(fd, F_GET_SEALS);
  absl::Status bad;
  if (fstat(fd, &st) != 0 || st.st_size != request.bytes()) {
    bad = absl::FailedPreconditionError(
        absl::StrCat("the worker's region ", path, " is not ", request.bytes(), " bytes"));
  } else if (seals < 0 || (seals & F_SEAL_SHRINK) == 0 || (seals & F_SEAL_GROW) == 0) {
    bad = absl::FailedPreconditionError(
        absl::StrCat("the worker's region ", path, " is not sealed against shrinking and growing"));
  }
  if (!bad.ok()) {
    close(fd);
    return bad;
  }
  void* base = mmap(nullptr, static_cast<size_t>(request.bytes()), PROT_READ | PROT_WRITE,
                    MAP_SHARED, fd, 0);
  const int map_errno = errno;
  close(fd);  // the mapping keeps the file
  if (base == MAP_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("mapping the worker's region ", path, ": ", std::strerror(map_errno)));
  }
  auto region = std::make_shared<SharedRegion>(request.job(), request.pid(),
                                               static_cast<std::byte*>(base), request.bytes());
  if (request.proof().size() != kProofBytes ||
      request.bytes() < static_cast<int64_t>(kProofBytes) ||
      std::memcmp(base, request.proof().data(), kProofBytes) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the region ", path, " does not begin with the proof the caller sent: not its own"));
  }
  std::lock_guard lock(mu_);
  SweepLocked();
  if (regions_.size() >= kMaxRegions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this server holds ", regions_.size(), " shared regions already"));
  }
  static thread_local std::mt19937_64 rng(std::random_device{}());
  uint64_t id = 0;
  while (id == 0 || regions_.count(id) > 0) id = rng();
  regions_.emplace(id, std::move(region));
  return id;
}

absl::StatusOr<std::shared_ptr<SharedRegion>> SharedRegions::Find(uint64_t id,
                                                                  const std::string& job) const {
  std::lock_guard lock(mu_);
  auto it = regions_.find(id);
  if (it == regions_.end() || it->second->job() != job) {
    return WithDetail(absl::NotFoundError(absl::StrCat("shared region ", absl::Hex(id),
                                                       " is not attached to job ", job,
                                                       " on this server (attach it again)")),
                      MakeDetail(v1::ErrorDetail::UNKNOWN_REGION, job));
  }
  return it->second;
}

}  // namespace zo
