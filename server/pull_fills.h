// Pulls that the update itself writes (the in-process route): a puller of
// the version an update is about to write, or is writing, registers where
// each of its ranges goes, and the update, as it finishes each tile, rounds
// the tile's new weights into those places while they are still in its
// cache. The pull then costs the update a 16-bit write per element instead
// of a second pass over the fp32 master after it.
//
// A registration made while the update runs records the ranges it had
// already done (the caller reads those itself: they are final); every tile
// done later is filled. Whether a tile was done before is decided under
// this class's lock, which the tile's Fill also takes after the tile is
// marked done (ParamVersions::MarkDone), so no tile falls between the two.
//
// A registration is filled only by an update of its version, which began
// once the step was decided, and answered (Take) when that update ends:
// the version is then the job's. One registered `early` (a pull of some
// of the tensors) is answered as soon as the update has written all of its
// ranges, before the rest of the version is done: a worker pulling its
// first layers' tensors on their own has them while the update still
// writes the last ones. A skipped step or a restore leaves a registration
// unfilled, and so does an update that fails before the registration was
// taken (an early one taken before holds the decided step's weights; the
// failed update leaves the job needing a restore, which the worker
// follows). An unfilled puller reads as any pull does, and reads again
// what a speculation wrote ahead into it (Take says which parts).
//
// A speculative update (server/job_speculation.cc) writes ahead: the
// registrations made before it reached a tile get the tile's speculated
// weights then, while they are in cache. The update that keeps the
// speculation leaves those parts alone (they hold its bits already), and
// the chunks it speculates after it began (BeginUpdate with ahead_holds)
// count as written at once; one that drops it writes every tile again.
//
// Thread-safe: Fill runs on the update's workers, concurrently for disjoint
// tiles; the puller's calls on its own thread.
#ifndef ZO_SERVER_PULL_FILLS_H_
#define ZO_SERVER_PULL_FILLS_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <vector>

#include "absl/status/status.h"
#include "common/range_set.h"

namespace zo {

class PullFills {
 public:
  // Where one range of the server's local elements goes.
  struct Copy {
    int64_t local_offset = 0;
    int64_t n = 0;
    std::byte* dst = nullptr;
  };
  using Id = uint64_t;  // 0: none

  // For elements of `elem_bytes` bytes (the job's dtype).
  explicit PullFills(size_t elem_bytes) : elem_bytes_(static_cast<int64_t>(elem_bytes)) {}

  // Registers the copies (disjoint; any order) for `version`. Before its
  // update begins: `done_so_far` null. While it runs: `done_so_far` says
  // which ranges the update has done (ParamVersions::DoneRanges); those are
  // left to ReadDoneBefore; 0 (nothing registered) when the update has
  // ended meanwhile. The caller keeps every dst valid until Take or
  // Withdraw returns.
  Id Register(int64_t version, std::vector<Copy> copies,
              const std::function<RangeSet()>& done_so_far, bool early = false);

  // Writes the speculated tile [offset, offset + n) of `version` into each
  // of its registrations whose update has not begun, or has begun keeping
  // the speculation, and remembers it there: round(from, n, dst) as for
  // Fill. Runs on the speculation's workers, concurrently for disjoint
  // tiles.
  void FillAhead(int64_t version, int64_t offset, int64_t n,
                 const std::function<void(int64_t from, int64_t n, std::byte* dst)>& round);
  // A new speculation begins (the bank was discarded): what earlier ones
  // wrote ahead no longer says what the bank holds.
  void ForgetAhead();
  // The update of `version` begins: its registrations fill from now on.
  // `ahead_holds`: it keeps the speculation that FillAhead wrote, so the
  // parts written ahead are not written again, and count as filled (as do
  // those FillAhead writes from now on).
  void BeginUpdate(int64_t version, bool ahead_holds = false);
  // Writes the tile [offset, offset + n), already marked done, into each
  // filling registration's copies that overlap it: round(from, n, dst)
  // writes local elements [from, from + n) of the new version to dst.
  void Fill(int64_t offset, int64_t n,
            const std::function<void(int64_t from, int64_t n, std::byte* dst)>& round);
  // The update ended: every tile written (`whole`), or not (it failed).
  void EndUpdate(int64_t version, bool whole);

  // The registration's part the update had done when it registered:
  // read(from, n, dst) for each piece, stopping at the first error.
  absl::Status ReadDoneBefore(
      Id id,
      const std::function<absl::Status(int64_t from, int64_t n, std::byte* dst)>& read) const;
  // Removes the registration, first waiting while its update is still
  // filling it (until the update ends, or, registered early, until every
  // range of it is written); the bytes it covers when that update filled
  // it, nullopt when it did not (then read the pull as any other). When it
  // did not,
  // `written_ahead` (may be null) receives the parts of its copies that a
  // speculation wrote ahead: they hold weights no version has (a skipped
  // step dropped them), so the puller must read them again even where the
  // version equals the one its places held before.
  std::optional<int64_t> Take(Id id, std::vector<Copy>* written_ahead = nullptr);
  // Removes the registration without waiting for its update: once this
  // returns no Fill writes its copies.
  void Withdraw(Id id);

  int size() const;

 private:
  enum class State { kWaiting, kFilling, kFilled, kUnfilled };
  struct Registration {
    int64_t version = 0;
    State state = State::kWaiting;
    std::vector<Copy> copies;  // sorted by local_offset
    // Whether the tile [offset, offset + n) meets the span from the first
    // copy's start to the last one's end (copies are sorted and disjoint).
    bool Overlaps(int64_t offset, int64_t n) const {
      return !copies.empty() && offset < copies.back().local_offset + copies.back().n &&
             offset + n > copies.front().local_offset;
    }
    RangeSet done_before;
    // Written by FillAhead (several workers at once: under ahead_mu): what
    // holds the speculation that may be kept; and all it ever wrote, which
    // nothing forgets (Take reports it when no update filled the places).
    RangeSet ahead;
    RangeSet written_ahead;
    // Registered early, while filling (under ahead_mu too): the local
    // ranges that hold the update's bits (done before, kept ahead, filled),
    // and whether they cover every copy, which lets Take answer before the
    // update ends.
    bool early = false;
    RangeSet written;
    size_t first_unwritten = 0;  // into copies
    bool whole = false;
    std::unique_ptr<std::mutex> ahead_mu = std::make_unique<std::mutex>();
    // It became whole or its update ended: its own, so that one puller's
    // answer wakes no other (a worker pulling tensor by tensor waits on
    // many at once).
    std::unique_ptr<std::condition_variable_any> changed =
        std::make_unique<std::condition_variable_any>();
  };
  // round() for the part of [offset, offset + n) that r's copies cover;
  // whether there was any.
  static bool WriteCopies(const Registration& r, int64_t elem_bytes, int64_t offset, int64_t n,
                          const std::function<void(int64_t, int64_t, std::byte*)>& round);
  // A filling registration's `written` grew by [offset, offset + n) (with
  // its ahead_mu held): whether that made an early one whole.
  static bool AddWritten(Registration& r, int64_t offset, int64_t n);

  const int64_t elem_bytes_;
  // Fill holds mu_ shared, so that Register, Take and Withdraw (exclusive)
  // are ordered with each tile's fill.
  mutable std::shared_mutex mu_;
  std::map<Id, Registration> registrations_;
  Id next_ = 1;
  int64_t updating_ = -1;        // the version an update is writing, between Begin and EndUpdate
  bool ahead_holds_ = false;     // that update keeps the speculation
  std::atomic<int> filling_{0};  // registrations in kFilling: Fill's fast way out
};

}  // namespace zo

#endif  // ZO_SERVER_PULL_FILLS_H_
