// Optimizer state (fp32 master, m, v) of one server's elements, grouped in
// sub-groups of `sub_group_elems` that stay in RAM up to a byte budget; the
// rest live in swap files on NVMe (docs/architecture.md, "Memory tiers"). A step streams
// the NVMe-resident sub-groups through `buffer_count` aligned buffers: read
// sub-group k+1 while updating k with the fused kernel while writing k-1.
//
// The fp32 gradient accumulator and the low-precision copy are always in RAM
// and are passed to each step by the caller (the server's job state).
//
// Every block written carries a checksum verified on read; a mismatch, a short
// read or a failed write fails the step with an error naming the sub-group and
// offset, and the state then refuses further work (FAILED_PRECONDITION "needs
// restore") until it is loaded again: it never reports success over partial
// state. Swap files are scratch; checkpoints are the durable state.
//
//   TieredStateOptions opt{.swap_dir = "/nvme/job1", .sub_group_elems = 1 << 24,
//                          .ram_budget_bytes = 8ull << 30};
//   ZO_ASSIGN_OR_RETURN(auto state, TieredOptimizerState::Create(opt, elems, &pool));
//   ZO_RETURN_IF_ERROR(state->LoadMaster(0, initial_weights));
//   ZO_RETURN_IF_ERROR(state->AdamStep(constants, {accumulator, DType::kFloat32},
//                                      {fp16_copy, DType::kFloat16}));
#ifndef ZO_OFFLOAD_TIER_TIERED_STATE_H_
#define ZO_OFFLOAD_TIER_TIERED_STATE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "offload/gradient_source.h"
#include "offload/io/io_engine.h"
#include "offload/optimizer_kernels.h"
#include "offload/ranged_constants.h"
#include "offload/thread_pool.h"
#include "offload/tier/swap_io_stats.h"

namespace zo {

class DirectFile;

struct TieredStateOptions {
  // Directory for this job's swap files; created if missing. Empty: RAM only
  // (then ram_budget_bytes must cover all state).
  std::string swap_dir;
  int64_t sub_group_elems = 1'000'000'000;  // zero_optimization.sub_group_size
  // Bytes of optimizer state (12 per element) kept in RAM; sub-groups beyond
  // it go to NVMe. < 0: no limit (everything in RAM).
  int64_t ram_budget_bytes = -1;
  int buffer_count = 4;   // offload_optimizer.buffer_count; >= 3 when anything is on NVMe
  bool checksums = true;  // off only for benchmarking
  IoEngineOptions io;     // from the config's aio section
};

// Sees elements [offset, offset + n) of the state as they are (master, m, v
// each n floats, valid during the call): the checkpoint snapshot's hook
// (server/state_snapshot.h). Called on the pool's workers, concurrently for
// disjoint ranges.
using StateObserver = std::function<void(int64_t offset, int64_t n, const float* master,
                                         const float* m, const float* v)>;

// What Create builds itself unless a test replaces it.
struct TieredStateSeams {
  // The I/O engine (default: CreateIoEngine(options.io)), e.g. a
  // fault-injecting one (offload/io/fault_injecting_backend.h).
  std::function<absl::StatusOr<std::unique_ptr<IoEngine>>(const IoEngineOptions&)> make_engine;
  // Reserves the swap file's bytes (default: DirectFile::Allocate).
  std::function<absl::Status(DirectFile& file, uint64_t bytes)> preallocate;
};

// Thread-compatible: one call at a time. The pool is borrowed and must
// outlive the state. (Private members and whether the class uses a pimpl are
// the implementation's choice; the public methods are the contract.)
class TieredOptimizerState {
 public:
  // Validates options, creates the swap files preallocated to full size (a
  // full disk is found here, RESOURCE_EXHAUSTED naming the file, not mid-step)
  // and allocates RAM sub-groups with first touch by the pool's workers.
  // master, m and v start at zero.
  static absl::StatusOr<std::unique_ptr<TieredOptimizerState>> Create(
      const TieredStateOptions& options, int64_t total_elems, ThreadPool* pool);
  // The same with test seams.
  static absl::StatusOr<std::unique_ptr<TieredOptimizerState>> Create(
      const TieredStateOptions& options, int64_t total_elems, ThreadPool* pool,
      TieredStateSeams seams);

  ~TieredOptimizerState();

  int64_t total_elems() const;
  int64_t num_sub_groups() const;
  int64_t ram_sub_groups() const;  // the first ones; the rest are on NVMe
  int64_t nvme_sub_groups() const;
  // Whether every tile starts on the kTileElems grid of the flat index
  // space (one sub-group, or sub-groups a multiple of tiles long), so that
  // none crosses a lent gradient block (AdamStep).
  bool tiles_on_grid() const;
  // Elements [0, ram_elems()) are in RAM, the rest on NVMe.
  int64_t ram_elems() const;
  // The fp32 master of elements [0, ram_elems()), where it lies. Readable
  // from any thread, concurrently with other readers, while the caller
  // keeps AdamStep, LoadMaster and WriteState away (the server's served
  // weights are rounded from it: server/param_versions.h).
  const float* ram_master() const;
  // Its moments, the same way (the server undoes a step from them).
  const float* ram_m() const;
  const float* ram_v() const;
  // Bytes this state holds in RAM: the RAM sub-groups' master, m and v, the
  // swap buffers and a speculation's bank.
  int64_t ram_bytes() const;
  // The NVMe swap's I/O so far (zeros when everything is in RAM). Unlike the
  // rest of the class, callable from any thread at any time.
  SwapIoStats swap_io_stats() const;

  // Sets master[offset, offset + values.size()) and zeroes m and v there.
  // Clears a "needs restore" state when it covers every element since it.
  // (While restoring, a partly covered NVMe sub-group is read without its
  // checksums: its other elements are rewritten later anyway.)
  absl::Status LoadMaster(int64_t offset, absl::Span<const float> values);
  // Copies state out (checkpoints, tests); any of the spans may be empty, the
  // others have one size. FAILED_PRECONDITION while the state needs restore.
  absl::Status ReadState(int64_t offset, absl::Span<float> master, absl::Span<float> m,
                         absl::Span<float> v);
  // Sets all three (restore from a checkpoint); the spans have one size.
  // Clears "needs restore" as LoadMaster does.
  absl::Status WriteState(int64_t offset, absl::Span<const float> master, absl::Span<const float> m,
                          absl::Span<const float> v);

  // One fused Adam/AdamW step over all elements: `grad` and `low_precision`
  // (optional) each cover total_elems, indexed like the state.
  // `updated`, if set, is called on the calling thread with growing `end`
  // whenever elements [0, end) are updated (their gradient no longer read,
  // their low-precision copy written): after the RAM sub-groups, then after
  // each NVMe sub-group, last with total_elems. The server uses it to let
  // the next step's gradients into a chunk as soon as its update is done.
  // Not called past a failure.
  // `before_update`, if set, sees every tile just before its update (NVMe
  // tiles after their checksums are verified): a snapshot copies what the
  // step is about to change.
  // `tile_updated`, if set, sees each tile once its update is written (on
  // the pool's workers, concurrently for disjoint tiles), with its state
  // after the step: pulls of the new version may read it from then on
  // (server/param_versions.h). With `old_weights_dtype` it also gets the
  // tile's weights from before the step rounded to that dtype (a delayed
  // parameter update serves the version the step replaces from there on);
  // `low_precision` must then be empty (the kernel's one copy is the old
  // weights'). With nullopt, old_weights is null.
  struct UpdatedTile {
    int64_t offset = 0;
    int64_t n = 0;
    const void* old_weights = nullptr;  // n elements of old_weights_dtype, or null
    const float* p = nullptr;           // n elements each, after the step (valid
                                        // during the call: NVMe tiles are buffers)
    const float* m = nullptr;
    const float* v = nullptr;
  };
  using TileUpdated = std::function<void(const UpdatedTile&)>;
  absl::Status AdamStep(const AdamStepConstants& c, TypedConstPtr grad, TypedPtr low_precision,
                        const std::function<void(int64_t end)>& updated = nullptr,
                        const StateObserver& before_update = nullptr,
                        const TileUpdated& tile_updated = nullptr,
                        std::optional<DType> old_weights_dtype = DType::kFloat16);
  // The same with constants by element range (parameter groups): a tile
  // that spans runs is updated run by run; each element gets the bits a
  // step with its run's constants alone would give it.
  // `grad` may be lent block by block (offload/gradient_source.h): the
  // tiles lie within its blocks wherever sub-groups start on the tile grid
  // (a multiple of kTileElems, or one sub-group), which the caller sees to.
  absl::Status AdamStep(const RangedConstants<AdamStepConstants>& c, const GradientSource& grad,
                        TypedPtr low_precision,
                        const std::function<void(int64_t end)>& updated = nullptr,
                        const StateObserver& before_update = nullptr,
                        const TileUpdated& tile_updated = nullptr,
                        std::optional<DType> old_weights_dtype = DType::kFloat16);

  // ---- Speculation: an update begun before its step is decided ----
  // The update of a step whose constants are only guessed so far (the
  // server's speculative update: docs/architecture.md, "One training step")
  // is written into a second bank of master, m and v beside the state, so
  // the state, and the pulls and checkpoints that read it, stay as they
  // are until the decision. A step decided with the guessed constants
  // makes the bank the state (CommitSpeculation: no copy); any other
  // decision forgets the bank (DiscardSpeculation) and the step runs as
  // AdamStep. Either way the state ends bit for bit where AdamStep with the
  // decided constants would leave it.
  //
  // Allocates the bank (12 bytes per element, first touch by the pool's
  // workers) unless it is there. UNIMPLEMENTED when sub-groups lie on NVMe
  // (their update streams through the swap buffers, with nowhere beside the
  // state to write).
  absl::Status ReserveSpeculation();
  bool speculation_reserved() const;
  // Elements [offset, offset + n): the step with constants `c` from `grad`
  // (indexed like the state), written into the bank, on the pool's workers
  // but one (a pool of one: on the calling thread), or with `all_workers`
  // on all of them (nothing else needs a core meanwhile).
  // Every call until the next Commit or Discard passes the same constants
  // and disjoint ranges. FAILED_PRECONDITION without a bank or while the
  // state needs restore.
  // With `rounded` set, `tile_rounded` sees each piece's new weights rounded
  // to that dtype (what AdamStep's low-precision copy would hold), from a
  // scratch of the worker's that is still in its cache: where pulls of the
  // step's version can take them from before the step is decided.
  struct RoundedTile {
    int64_t offset = 0;
    int64_t n = 0;
    const void* weights = nullptr;  // n elements of the dtype, valid during the call
  };
  using TileRounded = std::function<void(const RoundedTile&)>;
  absl::Status SpeculateAdam(const RangedConstants<AdamStepConstants>& c,
                             const GradientSource& grad, int64_t offset, int64_t n,
                             std::optional<DType> rounded = std::nullopt,
                             const TileRounded& tile_rounded = nullptr, bool all_workers = false);
  // Elements written into the bank since the last Commit or Discard.
  int64_t speculated_elems() const;
  // The step is decided with constants `c`, which are those every
  // SpeculateAdam since the last Commit or Discard used (the caller
  // compared them): writes the elements not yet speculated into the bank
  // too, then makes the bank the state and the old state the next bank.
  // `before_update`, if set, sees every tile as it was (the state before
  // the step, as AdamStep shows it); then, once the bank is the state,
  // `tile_updated` sees every tile of it (old_weights null). Both on the
  // pool's workers, concurrently for disjoint tiles.
  absl::Status CommitSpeculation(const RangedConstants<AdamStepConstants>& c,
                                 const GradientSource& grad,
                                 const StateObserver& before_update = nullptr,
                                 const TileUpdated& tile_updated = nullptr);
  // Forgets what the bank holds; the state is unchanged. Also what
  // AdamStep, LoadMaster and WriteState do to a speculation under way.
  void DiscardSpeculation();

  // Streams every NVMe-resident sub-group through the step's pipeline with
  // `observer` in place of the update (verified on read, written back
  // unchanged): a snapshot of NVMe state when no step comes to carry it.
  absl::Status ObserveNvme(const StateObserver& observer);

  // Reads and writes back every NVMe-resident sub-group through the same
  // pipeline with no update: the "I/O alone" of `zo-bench nvme`. No checksum
  // work either (the bytes go back unchanged). A sub-group never written
  // since Create is zero-filled rather than read: load the state first.
  absl::Status IoOnlyPass();

  // OK, or the sticky error that put the state in "needs restore".
  absl::Status health() const;

  // The swap file ("" when everything is in RAM) and the engine moving it
  // ("io_uring", "pread", ...; "" without one): for logs and benchmarks.
  std::string swap_path() const;
  std::string_view io_engine_name() const;

  TieredOptimizerState(const TieredOptimizerState&) = delete;
  TieredOptimizerState& operator=(const TieredOptimizerState&) = delete;

 private:
  struct Impl;
  explicit TieredOptimizerState(std::unique_ptr<Impl> impl);

  const std::unique_ptr<Impl> impl_;
};

}  // namespace zo

#endif  // ZO_OFFLOAD_TIER_TIERED_STATE_H_
