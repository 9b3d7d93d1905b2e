#include "worker/client/internal/worker_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"

namespace zo::client_internal {

absl::StatusOr<std::unique_ptr<WorkerRegion>> WorkerRegion::Create(int64_t area_bytes) {
  if (area_bytes <= 0 || area_bytes > (int64_t{1} << 42)) {
    return absl::InvalidArgumentError(absl::StrCat("a region of 3 x ", area_bytes, " bytes"));
  }
  const int fd = memfd_create("zo-data-route", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    return absl::ResourceExhaustedError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  }
  const int64_t bytes = kHeaderBytes + 3 * area_bytes;
  // Pages come as they are first written.
  if (ftruncate(fd, bytes) != 0) {
    const int err = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("sizing the region to ", bytes, " bytes: ", std::strerror(err)));
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int err = errno;
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat("sealing the region: ", std::strerror(err)));
  }
  void* base = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("mapping the region of ", bytes, " bytes: ", std::strerror(err)));
  }
  // The proof: random bytes only this process (and whom it tells) knows.
  std::random_device random;
  for (size_t i = 0; i < kProofBytes; i += sizeof(uint32_t)) {
    const uint32_t word = random();
    std::memcpy(static_cast<std::byte*>(base) + i, &word, sizeof(word));
  }
  return std::unique_ptr<WorkerRegion>(
      new WorkerRegion(fd, static_cast<std::byte*>(base), area_bytes));
}

WorkerRegion::~WorkerRegion() {
  munmap(base_, static_cast<size_t>(bytes()));
  close(fd_);
}

}  // namespace zo::client_internal
