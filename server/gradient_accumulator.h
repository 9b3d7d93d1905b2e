// The gradient buffer of the chunks one server owns, and the per-chunk
// accounting of pushes into it (docs/architecture.md, "One training step").
// With several dp ranks, or micro-batches pushed one by one
// (zo.gradient_accumulation "servers"), it accumulates in fp32; with one
// push per element and step, it keeps the 16-bit gradients as received
// (2 bytes per element instead of 4, nothing to convert or zero):
//
//   TryPush(step t, rank r, range) -> claims the range in the chunk's
//                                   coverage and adds (or stores) it; while
//                                   the chunk still updates t-1 it keeps a
//                                   wake callback instead (no thread waits)
//                                   (or, lent by an in-process worker, keeps
//                                   the caller's bytes to read in place)
//   TakeFilled()                 -> the chunks that got every rank's
//                                   gradients since the last call (a
//                                   speculative update begins on them)
//   Ready()                      -> every chunk has every rank's gradients
//   Stats() / data()             -> the step thread reads the whole buffer
//   Release(chunks, t)           -> those chunks are zeroed and take t + 1
//
// There is no second gradient buffer: a chunk takes pushes for t + 1 as soon
// as its update for t is done.
//
// Thread-safety: TryPush, CancelWait, Push, Ready, Close, Reopen and Reset
// may be called from any thread. Stats, data and Release belong to the one step thread, and only
// between Ready() and the Release of a chunk: pushes into that chunk wait
// until it is released, so the step thread reads and writes it unlocked.
#ifndef ZO_SERVER_GRADIENT_ACCUMULATOR_H_
#define ZO_SERVER_GRADIENT_ACCUMULATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/wake_queue.h"
#include "offload/aligned_buffer.h"
#include "offload/cpu_optimizer.h"
#include "offload/gradient_source.h"
#include "offload/thread_pool.h"
#include "server/chunk_coverage.h"
#include "server/gradient_piece_view.h"
#include "server/wait_list.h"

namespace zo {

// One chunk this server owns, placed in the server's local index space (the
// accumulator, the optimizer state and the served versions share it).
struct LocalChunk {
  int64_t id = 0;            // global chunk index
  int64_t local_offset = 0;  // first local element
  int64_t elems = 0;
};

class GradientAccumulator {
 public:
  struct Options {
    std::string job;  // for messages
    std::vector<LocalChunk> chunks;
    int dp_world_size = 1;
    // Pushes of every element per rank and step: gradient_accumulation_steps
    // when the servers sum the micro-batches (PushesPerRank), else 1.
    int pushes_per_rank = 1;
    DType dtype = DType::kFloat16;  // of pushed gradients
    ThreadPool* pool = nullptr;     // borrowed; outlives the accumulator
    WakeQueue* wakes = nullptr;     // borrowed; runs the callbacks of waiting pushes
    // Whether TakeFilled reports anything (a job that speculates).
    bool track_filled = false;
    // Whether the update reads gradients block by block
    // (offload/gradient_source.h), so TryPush may keep the whole blocks of
    // a lent piece rather than copy them. It does only where pushes are
    // stored as received and every chunk starts on a block.
    bool reads_lent = false;
    // Called, with no lock of the accumulator held, whenever Ready() may
    // have become true or, with track_filled, a chunk filled.
    std::function<void()> on_ready = {};
  };

  static absl::StatusOr<std::unique_ptr<GradientAccumulator>> Create(Options options);

  const std::vector<LocalChunk>& chunks() const { return chunks_; }
  int64_t local_elems() const { return local_elems_; }

  // A push that found its chunk still updating the previous step: what its
  // retry needs to know.
  struct PushWait {
    int64_t resets = -1;                        // Reset()s seen at the first try
    WaitList::Ticket ticket = WaitList::kNone;  // while its wake is kept
  };
  enum class PushOutcome { kAdded, kWaiting };

  // Accumulates `piece` into local chunk `index` (the caller has checked that
  // this server owns it and the dtype) without blocking. A piece for the
  // step after its chunk's is not added: `wake` is kept and posted to the
  // WakeQueue once the chunk is released, closed or reset, and the result is
  // kWaiting; the caller then retries with the same `wait`.
  // With `lent` (the owner of the piece's one span of bytes), the whole
  // gradient blocks of the piece are read where they are, not copied: the
  // accumulator keeps `lent` until the chunk is released (its update has
  // read them) or reset, and the caller leaves the bytes unchanged
  // meanwhile. A piece whose chunk cannot keep it is copied.
  // INVALID_ARGUMENT / OUT_OF_RANGE for a bad rank, size or range;
  // FAILED_PRECONDITION for a step that is not open; ALREADY_EXISTS for a
  // repeated range (ChunkCoverage); ABORTED when a Reset happened since the
  // first try; and the Close status while closed.
  absl::StatusOr<PushOutcome> TryPush(int index, const GradientPieceView& piece, PushWait* wait,
                                      std::function<void()> wake,
                                      std::shared_ptr<const void> lent = nullptr);
  // Takes back the wake of a waiting push; false when it was already posted.
  bool CancelWait(int index, const PushWait& wait);
  // Where local chunk `index`'s elements [offset, offset + n) of `step` are
  // kept, for the one contributor to write its gradient into before it
  // pushes it from there (TryPush then copies nothing): only where pushes
  // are stored as received, while the chunk takes `step` and none of the
  // range is delivered; an empty span otherwise (push as usual).
  absl::Span<std::byte> LendPlace(int index, int64_t step, int64_t offset, int64_t n);
  // TryPush, blocking the calling thread while it waits, at most until
  // `deadline` (DEADLINE_EXCEEDED). For tests and in-process callers.
  absl::Status Push(int index, const GradientPieceView& piece, absl::Time deadline);

  // Every chunk is complete for the step it takes and no push is still adding.
  bool Ready() const;
  // Step thread, with track_filled: the chunks (local indices, in the
  // order they filled) whose gradients for the step they take came in
  // whole, no push still adding into them, since the last call; each once
  // per step, none released since. From then until its Release the step
  // thread may read a filled chunk's gradients unlocked, as after Ready().
  std::vector<int> TakeFilled();
  // Whether TakeFilled would report a chunk now.
  bool has_filled() const;
  // Whether a push of `step` so far had bytes copied or summed into the
  // buffer (over gRPC, several ranks or micro-batches summed here) rather
  // than read where they lie: pushes that take the server's cores. The
  // ends of a lent piece that fill no block are copied but not counted:
  // they are small, and most tensors have them.
  bool CopiedPushes(int64_t step) const;
  // Pushes waiting for their chunk's release (their wakes kept).
  int waiting() const;

  // Step thread, while Ready(): per-chunk statistics of the buffer; with
  // `known`, the chunks whose entry is set are not read again
  // (CpuOptimizer::ComputeGradStats).
  StepGradStats Stats() const;
  StepGradStats Stats(const std::vector<std::optional<GradStats>>& known) const;
  // Step thread: the statistics of filled chunks `which` (TakeFilled).
  // `all_workers` false: on one worker, leaving the others' cores to pushes.
  std::vector<GradStats> ChunkStats(const std::vector<int>& which, bool all_workers = true) const;
  // Step thread: the step's gradients, local_elems() elements of
  // gradient_dtype(), in the buffer but for the blocks kept lent.
  GradientSource gradients() const {
    return GradientSource::WithLent({accum_.data(), gradient_dtype()},
                                    reads_lent_ ? lent_blocks_.data() : nullptr);
  }
  // Whether pieces pushed with `lent` may be read in place.
  bool reads_lent() const { return reads_lent_; }
  // fp32 with several dp ranks; the pushed dtype with one.
  DType gradient_dtype() const { return StoresGradients() ? dtype_ : DType::kFloat32; }
  // Bytes of the buffer: what this accumulator adds to a server's RAM.
  int64_t buffer_bytes() const {
    return local_elems_ * static_cast<int64_t>(DTypeSize(gradient_dtype()));
  }

  // Step thread: chunks [begin, end) are done with `step`. Zeroes them
  // (unless pushes store) and lets their pushes for step + 1 in.
  void Release(size_t begin, size_t end, int64_t step);
  // Step thread, during an update that has finished the local elements
  // below `end_elem`: releases the chunks in [next, ...) that lie wholly
  // below it; returns the first chunk not released.
  size_t ReleaseBelow(size_t next, int64_t end_elem, int64_t step);

  // Pushes, waiting or new, fail with `status` (not OK) until Reopen.
  void Close(absl::Status status);
  void Reopen();
  // For a restore: aborts waiting pushes, waits for the ones adding, forgets
  // every delivery and zeroes the buffer; every chunk then takes `step`.
  // Call while closed, and not while the step thread reads the buffer.
  void Reset(int64_t step);

  GradientAccumulator(const GradientAccumulator&) = delete;
  GradientAccumulator& operator=(const GradientAccumulator&) = delete;

 private:
  explicit GradientAccumulator(Options options);

  // With one dp rank a push stores the bytes as received: no read of the
  // buffer while receiving and no zeroing between steps.
  bool StoresGradients() const { return contributors() == 1; }
  int contributors() const { return dp_world_size_ * pushes_per_rank_; }
  // Local elements [begin, end), each pool worker its own part.
  void Zero(int64_t begin, int64_t end);
  // Where the statistics read each block: through gradients() when blocks
  // may be lent.
  CpuOptimizer::GradBlockReader StatsReader() const;
  // The elements of chunk `c` at [begin, end) from its start, whose bytes
  // are at `src`: their whole blocks are marked lent, the rest copied.
  // False, having done nothing, when no block is whole.
  bool KeepLent(const LocalChunk& c, int64_t begin, int64_t end, const std::byte* src);
  // Requires mu_: forgets the blocks lent to chunk `index`, moving their
  // owners into `returned` (dropped unlocked: a deleter may take locks).
  void ForgetLentLocked(size_t index, std::vector<std::shared_ptr<const void>>* returned)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string job_;
  const std::vector<LocalChunk> chunks_;
  const int64_t local_elems_;
  const int dp_world_size_;
  const int pushes_per_rank_;
  const DType dtype_;
  ThreadPool* const pool_;
  WakeQueue* const wakes_;
  const bool track_filled_;
  const bool reads_lent_;
  const std::function<void()> on_ready_;

  AlignedBuffer accum_;  // local_elems_ of gradient_dtype()
  // Statistics (through StatsReader) and zeroing over accum_, threaded.
  std::unique_ptr<CpuOptimizer> view_;
  // Per gradient block: where a lent piece keeps it, or null. Written by
  // the push that claimed the block, read by the step thread once the
  // chunk filled (as the buffer is), cleared at its release.
  std::vector<const std::byte*> lent_blocks_;
  // Held while adding into one chunk: two ranks may push the same chunk.
  std::vector<std::unique_ptr<absl::Mutex>> chunk_mu_;

  mutable absl::Mutex mu_;
  std::vector<ChunkCoverage> coverage_ ABSL_GUARDED_BY(mu_);  // of the step in chunk_step_
  // The step each chunk takes gradients for.
  std::vector<int64_t> chunk_step_ ABSL_GUARDED_BY(mu_);
  int complete_chunks_ ABSL_GUARDED_BY(mu_) = 0;
  int adding_ ABSL_GUARDED_BY(mu_) = 0;                 // pushes claimed but not yet added
  std::vector<int> chunk_adding_ ABSL_GUARDED_BY(mu_);  // the same per chunk
  // Per chunk: filled for its step (complete, nothing adding) and reported
  // in filled_, which TakeFilled empties.
  std::vector<bool> chunk_filled_ ABSL_GUARDED_BY(mu_);
  std::vector<int> filled_ ABSL_GUARDED_BY(mu_);
  // Per chunk: the pushes for the step after the chunk's.
  std::vector<WaitList> waiters_ ABSL_GUARDED_BY(mu_);
  // Per chunk: the owners of the pieces whose blocks it reads in place.
  std::vector<std::vector<std::shared_ptr<const void>>> lent_owners_ ABSL_GUARDED_BY(mu_);
  int64_t resets_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status closed_ ABSL_GUARDED_BY(mu_);
  // The last step a push copied or summed bytes for (CopiedPushes).
  int64_t copied_step_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace zo

#endif  // ZO_SERVER_GRADIENT_ACCUMULATOR_H_
