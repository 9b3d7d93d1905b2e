// The low-precision weights a job serves to pulls, by version. Two buffers:
// the latest version's and the one before, so that with the delayed
// parameter update a worker can pull v_t while the step producing v_{t+1}
// writes the other buffer. A skipped step makes a new version with the same
// data (no copy), which lets a pull say "unchanged".
//
// Thread-safe. Writing a buffer waits until no pull still reads it.
#ifndef ZO_SERVER_PARAM_VERSIONS_H_
#define ZO_SERVER_PARAM_VERSIONS_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "offload/aligned_buffer.h"

namespace zo {

class ParamVersions {
 public:
  // Two buffers of `elems` elements of `dtype`; version 0 is all zeros.
  static absl::StatusOr<std::unique_ptr<ParamVersions>> Create(int64_t elems, DType dtype);

  DType dtype() const { return dtype_; }
  int64_t elems() const { return elems_; }
  // Bytes of both buffers.
  int64_t buffer_bytes() const { return 2 * elems_ * static_cast<int64_t>(DTypeSize(dtype_)); }

  // Starts over at `version` (a restore): waits for readers, then holds no
  // version until CommitBase, while the caller fills base_data().
  void Reset(int64_t version);
  void CommitBase();
  // Buffer 0: the initial weights (version 0) or a restored version.
  void* base_data();

  // The buffer the next applied step writes; waits until no pull reads it.
  // Follow with CommitWrite.
  void* BeginWrite();
  // The buffer from BeginWrite now holds `version` (= latest() + 1).
  void CommitWrite(int64_t version);
  // `version` (= latest() + 1) was skipped: same data as the one before.
  void RecordSkip(int64_t version);

  int64_t latest() const;
  // The version whose step produced v's data (v itself unless skipped);
  // nullopt for versions before the base or after latest().
  std::optional<int64_t> DataVersion(int64_t version) const;

  // Read access to one version's data while it lives.
  class Lease {
   public:
    Lease(Lease&& other) noexcept : owner_(other.owner_), buffer_(other.buffer_) {
      other.owner_ = nullptr;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    const void* data() const;

   private:
    friend class ParamVersions;
    Lease(ParamVersions* owner, int buffer) : owner_(owner), buffer_(buffer) {}
    ParamVersions* owner_;
    int buffer_;
  };
  // FAILED_PRECONDITION when the version's data is no longer (or not yet) held.
  absl::StatusOr<Lease> Acquire(int64_t version);

  // How often BeginWrite or Reset found readers in the way and went to wait:
  // lets a test know, without sleeping, that another thread is blocked.
  int64_t times_blocked() const;

 private:
  struct Buffer {
    AlignedBuffer memory;
    int64_t data_version = -1;  // -1: holds nothing
    int readers = 0;
  };
  ParamVersions(int64_t elems, DType dtype, AlignedBuffer a, AlignedBuffer b);
  std::optional<int64_t> DataVersionLocked(int64_t version) const;
  bool Unblocked(bool free);  // a wait predicate's result, counting the blocks; mu_ held

  const int64_t elems_;
  const DType dtype_;
  mutable std::mutex mu_;
  std::condition_variable readers_done_;
  Buffer buffers_[2];
  int64_t base_ = 0;
  std::vector<int64_t> data_version_;  // index: version - base_
  int writing_ = -1;
  int64_t times_blocked_ = 0;
};

}  // namespace zo

#endif  // ZO_SERVER_PARAM_VERSIONS_H_
