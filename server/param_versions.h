// The low-precision weights a job serves to pulls, by version
// (docs/architecture.md, "Memory tiers"). Two ways to hold them:
//
// - From the master (CreateFromMaster; the job's fp32 master is all in
//   RAM): the latest version is not stored. A pull rounds the master as it
//   reads, which gives the bytes an update's kernel would have written.
//   With keep_previous, one buffer holds the version before the latest: the
//   update's kernel writes the master as it was, rounded, into it while it
//   updates the master (AdamUpdate's CopyOf::kOldWeight), and says which
//   ranges are done (MarkKept), so a pull of v_t goes on from there while
//   the step producing v_{t+1} writes the master; a piece whose range is not
//   kept yet waits for it. 2 bytes per element (fp16/bf16), or none without
//   keep_previous, where an update waits for the pulls of the latest version
//   to end.
// - Materialized (Create; the master is partly on NVMe, where a pull cannot
//   read it): two buffers, the latest version's and the one before; each
//   update writes the older one (4 bytes per element).
//
// A skipped step makes a new version with the same data (no copy), which
// lets a pull say "unchanged".
//
// Thread-safe. An update waits until no pull still reads what it replaces.
#ifndef ZO_SERVER_PARAM_VERSIONS_H_
#define ZO_SERVER_PARAM_VERSIONS_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/range_set.h"
#include "offload/aligned_buffer.h"

namespace zo {

class ParamVersions {
 public:
  // Materialized: two buffers of `elems` elements of `dtype`; version 0 is
  // all zeros.
  static absl::StatusOr<std::unique_ptr<ParamVersions>> Create(int64_t elems, DType dtype);

  struct FromMaster {
    // Writes master elements [offset, offset + n) rounded to the dtype into
    // `out`. Called from pull threads and the update's thread, concurrently,
    // never between BeginWrite and CommitWrite (nor between Reset and
    // CommitBase), when the master may change.
    std::function<void(int64_t offset, int64_t n, void* out)> round_master;
    // Keep the version before the latest (the delayed parameter update
    // computes on it while the next update runs).
    bool keep_previous = true;
  };
  // Served from the master, whose version 0 is what round_master reads now.
  static absl::StatusOr<std::unique_ptr<ParamVersions>> CreateFromMaster(int64_t elems, DType dtype,
                                                                         FromMaster from);

  DType dtype() const { return dtype_; }
  int64_t elems() const { return elems_; }
  bool from_master() const { return static_cast<bool>(from_.round_master); }
  // Bytes of the buffers this holds: what it adds to a server's RAM.
  int64_t buffer_bytes() const {
    return BufferBytes(elems_, dtype_, from_master(), keep_previous());
  }
  // The same before creating one (the job's RAM check, zo-ctl estimate).
  static int64_t BufferBytes(int64_t elems, DType dtype, bool from_master, bool keep_previous);

  // What a restore brings of the version before the one it restores (a
  // checkpoint of a job with a delayed parameter update, whose next step
  // computes on it).
  enum class Previous {
    kNone,      // nothing: the restored version is the oldest held
    kStored,    // its weights, which the caller fills previous_data() with
    kSameData,  // the restored version's weights (the step between was skipped)
  };
  // Starts over at `version` (a restore): waits for readers, then holds no
  // version until CommitBase, while the caller fills base_data() (or, from
  // the master, the master) and, with kStored, previous_data(). kStored
  // needs keep_previous (a materialized one always keeps it).
  void Reset(int64_t version, Previous previous = Previous::kNone);
  void CommitBase();
  // Materialized: buffer 0, the initial weights (version 0) or a restored
  // version. Null when served from the master.
  void* base_data();
  // Between Reset(kStored) and CommitBase: where the version before the
  // restored one goes (materialized buffer 1, or the kept buffer).
  void* previous_data();
  // Whether the version before the latest is kept (materialized, or from the
  // master with keep_previous).
  bool keep_previous() const { return !from_master() || from_.keep_previous; }

  // An update begins; waits until no pull reads what it replaces.
  // Materialized: returns the buffer the update writes the new version's
  // low-precision copy into. From the master: the master may be written
  // until CommitWrite, and this returns null, or with keep_previous the kept
  // buffer, which the update fills with the latest version: the master as
  // it was before the update, rounded.
  void* BeginWrite();
  // From the master with keep_previous, between BeginWrite and CommitWrite:
  // kept-buffer elements [offset, offset + n) hold their part of the latest
  // version; pulls read them from now on. Thread-safe.
  void MarkKept(int64_t offset, int64_t n);
  // The update is done: the data now is `version` (= latest() + 1).
  void CommitWrite(int64_t version);
  // The update failed before CommitWrite: the latest version is held only if
  // it was wholly kept; pulls waiting for a range are told it is gone.
  void AbortWrite();
  // `version` (= latest() + 1) was skipped: same data as the one before.
  void RecordSkip(int64_t version);

  int64_t latest() const;
  // The version whose step produced v's data (v itself unless skipped);
  // nullopt for versions before the base or after latest().
  std::optional<int64_t> DataVersion(int64_t version) const;

  // Read access to one version's data while it lives.
  class Lease {
   public:
    Lease(Lease&& other) noexcept
        : owner_(other.owner_), buffer_(other.buffer_), version_(other.version_) {
      other.owner_ = nullptr;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    // The version's elements where they lie (materialized, or the kept
    // previous version), or null: then Read copies them out.
    const void* data() const;
    // Elements [offset, offset + n) into `out`. FAILED_PRECONDITION when the
    // version is no longer held (a pull that outlived two updates).
    absl::Status Read(int64_t offset, int64_t n, void* out) const;

   private:
    friend class ParamVersions;
    // buffer_: the buffer this lease keeps from being overwritten, kMaster
    // for the master, kUnpinned for none.
    static constexpr int kMaster = -1;
    static constexpr int kUnpinned = -2;
    Lease(ParamVersions* owner, int buffer, int64_t version)
        : owner_(owner), buffer_(buffer), version_(version) {}
    ParamVersions* owner_;
    int buffer_;
    int64_t version_;
  };
  // FAILED_PRECONDITION when the version's data is no longer (or not yet) held.
  absl::StatusOr<Lease> Acquire(int64_t version);

  // How often an update or Reset found readers in the way, or a read found
  // its range not yet kept, and went to wait: lets a test know, without
  // sleeping, that another thread is blocked.
  int64_t times_blocked() const;

 private:
  struct Buffer {
    AlignedBuffer memory;
    int64_t data_version = -1;  // -1: holds nothing
    int readers = 0;
  };
  ParamVersions(int64_t elems, DType dtype, FromMaster from);
  int num_buffers() const { return from_master() ? (from_.keep_previous ? 1 : 0) : 2; }
  std::optional<int64_t> DataVersionLocked(int64_t version) const;
  absl::Status NotHeldLocked(int64_t version) const;
  bool Unblocked(bool free);  // a wait predicate's result, counting the blocks; mu_ held
  bool NoReadersLocked() const;
  // Ends keeping: the kept buffer holds `keeping_` if all of it was kept
  // (returns whether it was); reads waiting for a range go on.
  bool EndKeepingLocked();
  // From the master: Lease::Read.
  absl::Status ReadFromMaster(int64_t version, int64_t offset, int64_t n, void* out);

  const int64_t elems_;
  const DType dtype_;
  const FromMaster from_;
  mutable std::mutex mu_;
  std::condition_variable readers_done_;
  Buffer buffers_[2];
  int64_t base_ = 0;
  std::vector<int64_t> data_version_;              // index: version - base_
  Previous resetting_previous_ = Previous::kNone;  // between Reset and CommitBase
  int writing_ = -1;
  // From the master: the data version the master holds (-1 while an update
  // or a restore writes it), the leases that keep it so for a whole pull
  // (without keep_previous), and the reads rounding it now.
  int64_t master_data_ = -1;
  int master_pins_ = 0;
  bool update_waiting_ = false;  // for the pins to go (without keep_previous)
  int master_reading_ = 0;
  // From the master with keep_previous, during an update: the data version
  // being kept (-1: none), its kept ranges, and the
  // reads waiting for a range.
  int64_t keeping_ = -1;
  RangeSet kept_ranges_;
  int keep_waiters_ = 0;
  std::condition_variable kept_more_;
  int64_t times_blocked_ = 0;
};

}  // namespace zo

#endif  // ZO_SERVER_PARAM_VERSIONS_H_
