// The regions of the same-host route (docs/architecture.md, "Routes"): a
// worker beside the server makes a sealed memfd, the server maps it
// (AttachRegion), and from then on that worker's pushes name bytes in it
// instead of carrying them and its pulls have the weights written into it.
//
// What the server checks before it maps one: it opens /proc/<pid>/fd/<fd>
// (the kernel lets only the same user, on the same host and in the same pid
// namespace, do that), the file is the size the worker says, sealed against
// shrinking (so the worker cannot truncate it under a read: SIGBUS) and
// growing, the worker's boot id is this host's, and the region begins with
// the random proof the request carries (a caller that names another
// process's region, which this server could open but the caller cannot
// read, does not know it). Every range a call names is checked against the
// region's size.
//
// A region lives until the worker's process is gone: each attach first
// drops the regions of processes that exited. At most kMaxRegions at once.
//
// Thread-safe.
#ifndef ZO_SERVER_SHARED_REGIONS_H_
#define ZO_SERVER_SHARED_REGIONS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/zo/v1/job.pb.h"

namespace zo {

// A mapped region; unmapped when the last holder lets go.
class SharedRegion {
 public:
  SharedRegion(std::string job, int64_t pid, std::byte* base, int64_t bytes)
      : job_(std::move(job)), pid_(pid), base_(base), bytes_(bytes) {}
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  const std::string& job() const { return job_; }
  int64_t pid() const { return pid_; }
  int64_t bytes() const { return bytes_; }
  // Bytes [offset, offset + n), or INVALID_ARGUMENT naming the range when it
  // is not inside the region.
  absl::StatusOr<absl::Span<std::byte>> Range(int64_t offset, int64_t n) const;
  // The acknowledgement slot at `offset` (GradientPiece.region_ack_offset):
  // two 32-bit words, the acknowledgement and the worker's count of threads
  // waiting on it. INVALID_ARGUMENT naming the offset unless it is a
  // multiple of 8 with the slot inside the region.
  absl::StatusOr<uint32_t*> AckSlot(int64_t offset) const;
  // Stores `ack` into the slot unless it holds a later one (the numbers
  // grow, and may wrap), then wakes the waiting threads if the worker says
  // there are any.
  static void Acknowledge(uint32_t* slot, uint32_t ack);

 private:
  const std::string job_;
  const int64_t pid_;
  std::byte* const base_;
  const int64_t bytes_;
};

// This host's boot id (/proc/sys/kernel/random/boot_id), or empty.
std::string HostBootId();

class SharedRegions {
 public:
  static constexpr size_t kMaxRegions = 256;
  // AttachRegionRequest.proof: the region's first bytes.
  static constexpr size_t kProofBytes = 16;

  // `enabled` false (zo-server --shared-memory=false): every attach is
  // refused, and workers use gRPC.
  explicit SharedRegions(bool enabled) : enabled_(enabled) {}

  // Maps the worker's region for job `request.job()`; returns its id.
  // FAILED_PRECONDITION when it cannot be used (another host, another user,
  // not sealed, the wrong size, disabled): the worker then uses gRPC.
  absl::StatusOr<uint64_t> Attach(const v1::AttachRegionRequest& request);
  // Region `id` of job `job`; NOT_FOUND when this server holds no such
  // region for that job (it restarted, or the worker's process exited).
  absl::StatusOr<std::shared_ptr<SharedRegion>> Find(uint64_t id, const std::string& job) const;

 private:
  // Drops the regions whose process has exited. Requires mu_.
  void SweepLocked();

  const bool enabled_;
  mutable std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<SharedRegion>> regions_;  // guarded by mu_
};

}  // namespace zo

#endif  // ZO_SERVER_SHARED_REGIONS_H_
