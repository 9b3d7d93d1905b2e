// The worker's side of a same-host route's region (server/shared_regions.h):
// a page holding a random proof of ownership, then the areas below;
// a memfd sized once, sealed against shrinking and growing (a server that
// maps it must never find it truncated under a read), and mapped here. Its
// layout is the client's: per server, two gradient areas (a step's pushes
// use area step % 2, so a step's pieces may still wait in theirs while the
// next step's are written) and a weights area, each the server's share of
// the job in its dtype, in the server's local element order. The first page
// also holds, per gradient area, the slot where the server acknowledges the
// pieces it has summed (region_credits.h). A lent piece
// (GradientPiece.region_lent) is read in its area until the server's update
// of its step: the area is written again only for the step after next.
#ifndef ZO_WORKER_CLIENT_INTERNAL_WORKER_REGION_H_
#define ZO_WORKER_CLIENT_INTERNAL_WORKER_REGION_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace zo::client_internal {

class WorkerRegion {
 public:
  // A region of 3 x `area_bytes`. RESOURCE_EXHAUSTED (no memfd, no memory)
  // or FAILED_PRECONDITION (no sealing) when it cannot be made.
  static absl::StatusOr<std::unique_ptr<WorkerRegion>> Create(int64_t area_bytes);
  ~WorkerRegion();
  WorkerRegion(const WorkerRegion&) = delete;
  WorkerRegion& operator=(const WorkerRegion&) = delete;

  // The first page: the random proof of ownership a server checks
  // (AttachRegionRequest.proof).
  static constexpr int64_t kHeaderBytes = 4096;
  static constexpr size_t kProofBytes = 16;

  int fd() const { return fd_; }
  int64_t bytes() const { return kHeaderBytes + 3 * area_bytes_; }
  int64_t area_bytes() const { return area_bytes_; }
  std::string proof() const {
    return std::string(reinterpret_cast<const char*>(base_), kProofBytes);
  }
  // Step `step`'s gradient area's acknowledgement slot
  // (GradientPiece.region_ack_offset): the server's acknowledgement, then
  // this process's count of threads waiting on it; each slot on its own
  // cache line.
  int64_t AckOffset(int64_t step) const { return 64 + 64 * (step % 2); }
  uint32_t* AckSlot(int64_t step) const {
    return reinterpret_cast<uint32_t*>(base_ + AckOffset(step));
  }
  // Where step `step`'s gradients go, and where pulled weights come.
  int64_t GradientAreaOffset(int64_t step) const { return kHeaderBytes + (step % 2) * area_bytes_; }
  int64_t WeightsAreaOffset() const { return kHeaderBytes + 2 * area_bytes_; }
  std::byte* base() const { return base_; }
  absl::Span<const std::byte> weights() const {
    return {base_ + WeightsAreaOffset(), static_cast<size_t>(area_bytes_)};
  }

 private:
  WorkerRegion(int fd, std::byte* base, int64_t area_bytes)
      : fd_(fd), base_(base), area_bytes_(area_bytes) {}
  const int fd_;
  std::byte* const base_;
  const int64_t area_bytes_;
};

}  // namespace zo::client_internal

#endif  // ZO_WORKER_CLIENT_INTERNAL_WORKER_REGION_H_
