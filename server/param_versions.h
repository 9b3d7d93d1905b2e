// The low-precision weights a job serves to pulls, by version
// (docs/architecture.md, "Memory tiers"). Two ways to hold them:
//
// - From the master (CreateFromMaster; the job's fp32 master is all in
//   RAM): the latest version is not stored. A pull rounds the master as it
//   reads, which gives the bytes an update's kernel would have written.
//   With keep_previous (a delayed parameter update computes on the version
//   before the latest while the next update runs), that version is not
//   stored either: a pull recomputes it by undoing the update that replaced
//   it (the Undo each update brings, offload/adam_undo.h) and applies the
//   corrections that update recorded for the rare elements where the undo
//   rounds to a neighbour of the true old weight. The update finds them per
//   tile, where it still holds the old weights (MarkKept). A piece the
//   update has not reached yet is read from the master as it still is: the
//   update claims each tile before it writes it (ClaimRange) and waits for
//   such reads of it to end, so a pull of the version before the latest
//   never waits for the update; a piece in a claimed tile waits for that
//   tile. About 0 bytes per element (the
//   corrections: tens of bytes per million elements with usual recipes;
//   never more than a copy), where keeping a copy cost 2. Without
//   keep_previous, an update waits for the pulls of the latest version to
//   end.
// - Materialized (Create; the master is partly on NVMe, where a pull cannot
//   read it): two buffers, the latest version's and the one before; each
//   update writes the older one (4 bytes per element).
//
// From the master, a pull may also read the version an update is writing,
// range by range as the update finishes them (MarkDone, MarkKept): the
// in-process route's pull follows the update instead of waiting for its
// end.
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
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
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
    // `out`. Called from pull threads and the update's thread, concurrently;
    // between BeginWrite and CommitWrite only for ranges the update is done
    // with or has not claimed (ClaimRange), never between Reset and
    // CommitBase.
    std::function<void(int64_t offset, int64_t n, void* out)> round_master;
    // Serve the version before the latest too (the delayed parameter
    // update computes on it while the next update runs).
    bool keep_previous = true;
  };
  // Writes the version before the latest update's, elements [offset,
  // offset + n), into `out`, recomputed from the state as that update left
  // it: RoundWeightsBeforeAdamStep with its constants. Deterministic (the
  // corrections found once hold for every later call). Called from pull
  // threads and the update's workers, only for ranges the update is done
  // with and until the next update or restore begins.
  using Undo = std::function<void(int64_t offset, int64_t n, void* out)>;
  // Served from the master, whose version 0 is what round_master reads now.
  static absl::StatusOr<std::unique_ptr<ParamVersions>> CreateFromMaster(int64_t elems, DType dtype,
                                                                         FromMaster from);

  DType dtype() const { return dtype_; }
  int64_t elems() const { return elems_; }
  bool from_master() const { return static_cast<bool>(from_.round_master); }
  // Bytes this holds: what it adds to a server's RAM (buffers and
  // corrections).
  int64_t buffer_bytes() const;
  // The buffers' part before creating one (the job's RAM check, zo-ctl
  // estimate); the corrections come on top, a few bytes per million
  // elements.
  static int64_t BufferBytes(int64_t elems, DType dtype, bool from_master);
  // From the master with keep_previous: how many elements of the version
  // before the latest (or the one an update is replacing) are corrected, and
  // in how many bytes (a range whose corrections would outweigh a copy of
  // it is held as a copy: all its elements count).
  struct CorrectionStats {
    int64_t elems = 0;
    int64_t bytes = 0;
  };
  CorrectionStats corrections() const;

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
  // needs keep_previous (a materialized one always keeps it). Fails only
  // when the buffer for the previous version cannot be had (from the master).
  absl::Status Reset(int64_t version, Previous previous = Previous::kNone);
  // From the master with kStored: `undo` recomputes the stored previous
  // version from the restored state; what it gets wrong becomes corrections
  // and the stored buffer is freed (without `undo` every range is a copy).
  void CommitBase(const Undo& undo = nullptr);
  // Materialized: buffer 0, the initial weights (version 0) or a restored
  // version. Null when served from the master.
  void* base_data();
  // Between Reset(kStored) and CommitBase: where the version before the
  // restored one goes (materialized buffer 1, or from the master a buffer
  // that lives until CommitBase).
  void* previous_data();
  // Whether the version before the latest is kept (materialized, or from the
  // master with keep_previous).
  bool keep_previous() const { return !from_master() || from_.keep_previous; }

  // An update begins; waits until no pull reads what it replaces.
  // Materialized: returns the buffer the update writes the new version's
  // low-precision copy into. From the master: the master may be written
  // until CommitWrite, and this returns null. With keep_previous, `undo`
  // recomputes the latest version from what this update leaves (null: every
  // range MarkKept is given is kept as a copy).
  void* BeginWrite(Undo undo = nullptr);
  // From the master, between BeginWrite and CommitWrite: the update is done
  // with elements [offset, offset + n); pulls of the version it writes read
  // the range from now on. Thread-safe; ranges are disjoint.
  void MarkDone(int64_t offset, int64_t n);
  // The same with keep_previous, where the range's weights before the
  // update were `old_weights` (n elements of the dtype). Records where the
  // undo differs; pulls of the version the update replaces read the range
  // from now on too.
  void MarkKept(int64_t offset, int64_t n, const void* old_weights);
  // The same where the caller found the differences itself (the job, with
  // FindUndoMismatches: cheaper than undoing every element): `index`
  // (ascending, within the range) and `values` (index.size() elements of
  // the dtype) are the elements the undo gets wrong and their true weights.
  // Needs the update's undo (BeginWrite's).
  void MarkKept(int64_t offset, int64_t n, std::vector<uint32_t> index,
                std::vector<uint8_t> values);
  // From the master with keep_previous, between BeginWrite and CommitWrite:
  // the update is about to write elements [offset, offset + n) (a tile).
  // Waits for the reads of the version it replaces that take the range
  // from the master as it still is; later reads of it wait for MarkKept.
  // Thread-safe; ranges are disjoint.
  void ClaimRange(int64_t offset, int64_t n);
  // From the master: the ranges of `version` written so far: those its
  // update is done with while it runs, all once it is committed, none
  // before.
  RangeSet DoneRanges(int64_t version) const;
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
    // The version's elements where they lie (materialized), or null: then
    // Read computes them.
    const void* data() const;
    // Elements [offset, offset + n) into `out`. FAILED_PRECONDITION when the
    // version is no longer held (a pull that outlived two updates).
    absl::Status Read(int64_t offset, int64_t n, void* out) const;

   private:
    friend class ParamVersions;
    // buffer_: the buffer this lease keeps from being overwritten, kMaster
    // for the master, kPrevious for the undone previous version (its
    // update waits), kUnpinned for none.
    static constexpr int kMaster = -1;
    static constexpr int kUnpinned = -2;
    static constexpr int kPrevious = -3;
    Lease(ParamVersions* owner, int buffer, int64_t version)
        : owner_(owner), buffer_(buffer), version_(version) {}
    ParamVersions* owner_;
    int buffer_;
    int64_t version_;
  };
  // FAILED_PRECONDITION when the version's data is no longer (or not yet)
  // held. From the master, the version an update is writing (latest() + 1)
  // is held: its lease's reads wait for their ranges to be done, and fail
  // if the update aborts.
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
  // Where the undo of one range rounds otherwise than the true old weights:
  // their indices (ascending, within the range) and values, or, when that
  // would take more room, the whole range's weights.
  struct Corrections {
    int64_t n = 0;
    std::vector<uint32_t> index;
    std::vector<uint8_t> values;  // index.size() elements of the dtype
    std::vector<uint8_t> whole;   // n elements, instead of index and values
    int64_t bytes() const {
      return static_cast<int64_t>(index.size() * sizeof(uint32_t) + values.size() + whole.size());
    }
  };
  ParamVersions(int64_t elems, DType dtype, FromMaster from);
  int num_buffers() const { return from_master() ? 0 : 2; }
  std::optional<int64_t> DataVersionLocked(int64_t version) const;
  absl::Status NotHeldLocked(int64_t version) const;
  bool Unblocked(bool free);  // a wait predicate's result, counting the blocks; mu_ held
  bool NoReadersLocked() const;
  // `truth` against the undo's `undone` (n elements each).
  Corrections FindCorrections(const void* truth, const void* undone, int64_t n) const;
  void AddCorrectionsLocked(int64_t offset, Corrections c);
  void KeptLocked(int64_t offset, int64_t n, Corrections c);
  void ClearCorrectionsLocked();
  // Overwrites out's elements (for [offset, offset + n)) that have corrections.
  void ApplyCorrectionsLocked(int64_t offset, int64_t n, void* out) const;
  // Ends an update's ranges: the previous version is held if all of it was
  // kept (returns whether it was); reads waiting for a range go on (and
  // find the version written, or gone).
  bool EndWritingLocked();
  // Wakes the reads waiting for ranges when one of them is done now (a wake
  // per tile would take the update's cores from it).
  void NotifyRangeReadersLocked();
  // Waits on range_done_ for [offset, offset + n).
  void AwaitRangeLocked(std::unique_lock<std::mutex>& lock, int64_t offset, int64_t n);
  // Whether a read of the replaced version takes part of [offset, offset +
  // n) from the master.
  bool ReadAheadLocked(int64_t offset, int64_t n) const;
  // round_master into `out` with mu_ released meanwhile (counted as a read
  // of the master, which an update or a restore waits for).
  void RoundMasterUnlocked(std::unique_lock<std::mutex>& lock, int64_t offset, int64_t n,
                           void* out);
  // From the master: Lease::Read.
  absl::Status ReadFromMaster(int64_t version, int64_t offset, int64_t n, void* out);

  const int64_t elems_;
  const DType dtype_;
  const FromMaster from_;
  mutable std::mutex mu_;
  std::condition_variable readers_done_;
  Buffer buffers_[2];  // materialized
  int64_t base_ = 0;
  std::vector<int64_t> data_version_;              // index: version - base_
  Previous resetting_previous_ = Previous::kNone;  // between Reset and CommitBase
  AlignedBuffer restoring_previous_;               // from the master, the same
  int writing_ = -1;
  // From the master: the data version the master holds (-1 while an update
  // or a restore writes it), the leases that keep it so for a whole pull
  // (without keep_previous), and the reads computing from the state now.
  int64_t master_data_ = -1;
  int master_pins_ = 0;
  bool update_waiting_ = false;  // for the pins to go (without keep_previous)
  int master_reading_ = 0;
  // From the master with keep_previous: the data version before the
  // master's, served by undoing the last update (-1: none), the leases that
  // keep it (a checkpoint writing it), and the update recomputing it (undo_).
  int64_t previous_data_ = -1;
  int previous_pins_ = 0;
  Undo undo_;
  // From the master during an update: the version it writes (-1: none),
  // the data version it replaces when that one is kept (-1: none), the
  // ranges done (MarkDone, MarkKept), and the reads waiting for a range.
  int64_t writing_version_ = -1;
  int64_t keeping_ = -1;
  RangeSet done_ranges_;
  // With keeping_: the tiles the update has claimed (ClaimRange), and the
  // reads of the kept version taking ranges it has not claimed from the
  // master, [begin, end) each.
  RangeSet claimed_ranges_;
  std::vector<std::pair<int64_t, int64_t>> reads_ahead_;
  std::vector<std::pair<int64_t, int64_t>> waited_ranges_;  // [begin, end), one per read
  std::condition_variable range_done_;
  // The corrections of previous_data_ (or keeping_), by range offset.
  std::map<int64_t, Corrections> corrections_;
  CorrectionStats correction_stats_;
  int64_t times_blocked_ = 0;
};

}  // namespace zo

#endif  // ZO_SERVER_PARAM_VERSIONS_H_
