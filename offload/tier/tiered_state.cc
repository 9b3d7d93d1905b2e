#include "offload/tier/tiered_state.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/range_set.h"
#include "common/status_macros.h"
#include "offload/aligned_buffer.h"
#include "offload/cpu_optimizer.h"
#include "offload/io/aligned_buffer_pool.h"
#include "offload/io/direct_file.h"
#include "offload/tier/swap_file.h"
#include "offload/tier/swap_layout.h"
#include "offload/tier/swap_pipeline.h"
#include "offload/tier/tile_runner.h"

namespace zo {
namespace {

constexpr int64_t kStateBytesPerElem = kStateArrays * sizeof(float);

absl::Status ValidateOptions(const TieredStateOptions& o, const SwapLayout& layout,
                             int64_t total_elems, const ThreadPool* pool) {
  if (pool == nullptr) return absl::InvalidArgumentError("tiered state: no thread pool");
  if (total_elems < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tiered state: total_elems = ", total_elems, " is negative"));
  }
  if (o.sub_group_elems <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sub_group_elems (zero_optimization.sub_group_size) = ", o.sub_group_elems,
                     ": must be positive"));
  }
  if (layout.nvme_sub_groups() == 0) return absl::OkStatus();
  if (o.swap_dir.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ram_budget_bytes = ", o.ram_budget_bytes, " holds ", layout.ram_sub_groups(), " of ",
        layout.num_sub_groups(), " sub-groups (", total_elems * kStateBytesPerElem,
        " bytes of state) and swap_dir is empty: give an NVMe path or a larger budget"));
  }
  if (o.buffer_count < 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer_count (offload_optimizer.buffer_count) = ", o.buffer_count,
                     ": the NVMe pipeline needs at least 3 (read k+1, update k, write k-1)"));
  }
  ZO_RETURN_IF_ERROR(ValidateIoEngineOptions(o.io));
  if (kSwapAlignBytes % o.io.alignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat("I/O engine option alignment = ", o.io.alignment,
                                                   ": must divide ", kSwapAlignBytes));
  }
  return absl::OkStatus();
}

// `what` failed: the status, saying the state now needs restore.
absl::Status Failed(absl::string_view what, const absl::Status& status) {
  const std::string message =
      absl::StrCat(what, " failed; the optimizer state needs restore: ", status.message());
  return absl::Status(status.code(), message);
}

}  // namespace

struct TieredOptimizerState::Impl {
  Impl(const TieredStateOptions& o, int64_t total, ThreadPool* p)
      : options(o), layout(total, o.sub_group_elems, o.ram_budget_bytes), pool(p) {}

  // Copies in or out: n elements of sub-group `sg` whose state starts at p,
  // m and v, from or to position `src` of the caller's spans.
  using PieceFn =
      std::function<void(int64_t sg, float* p, float* m, float* v, int64_t src, int64_t n)>;

  float* Ram(int array) const { return ram[array].as<float>(); }
  void ForRamTiles(const std::function<void(int64_t sg, int64_t begin, int64_t end)>& fn,
                   const std::function<void()>& pump) const;
  absl::Status CheckRange(absl::string_view what, int64_t offset, int64_t len) const;
  absl::Status NeedsRestore() const;
  absl::Status Record(absl::string_view what, absl::Status status);
  absl::Status Write(absl::string_view what, int64_t offset, int64_t len, const PieceFn& fill);
  absl::Status Read(int64_t offset, int64_t len, const PieceFn& copy_out);
  void AddRestored(int64_t begin, int64_t end);

  const TieredStateOptions options;
  const SwapLayout layout;
  ThreadPool* const pool;
  AlignedBuffer ram[kStateArrays];  // master, m, v of the RAM sub-groups

  // The NVMe tier, null when all is in RAM. In this order so that the engine
  // (which waits for its in-flight I/O) goes before the buffers and file.
  std::unique_ptr<SwapFile> file;
  std::unique_ptr<AlignedBufferPool> buffers;
  std::unique_ptr<IoEngine> engine;
  std::unique_ptr<SwapPipeline> pipeline;

  absl::Status error;  // sticky: the first failure
  RangeSet restored;   // rewritten since `error`

  // A speculation's bank (master, m, v beside the RAM state; empty until
  // reserved) and the elements it holds the step's values of.
  AlignedBuffer bank[kStateArrays];
  RangeSet speculated;
  // A tile of rounded weights per pool worker (SpeculateAdam's `rounded`).
  std::vector<AlignedBuffer> rounded_scratch;
  float* Bank(int array) const { return bank[array].as<float>(); }
  // The step with constants `c` of elements [begin, end), all in RAM, from
  // the state into the bank; with `rounded`, the new weights rounded to it
  // into rounded.data (indexed from `begin`).
  void UpdateBeside(const RangedConstants<AdamStepConstants>& c, const GradientSource& grad,
                    int64_t begin, int64_t end, TypedPtr rounded = {}) const;
};

void TieredOptimizerState::Impl::UpdateBeside(const RangedConstants<AdamStepConstants>& c,
                                              const GradientSource& grad, int64_t begin,
                                              int64_t end, TypedPtr rounded) const {
  c.ForEach(begin, end, [&](int64_t b, int64_t e, const AdamStepConstants& k) {
    const TypedPtr out =
        rounded.data == nullptr ? TypedPtr{} : OffsetBy(rounded, static_cast<size_t>(b - begin));
    AdamUpdateBeside(k, grad.At(b, e - b), Ram(kStateMaster) + b, Ram(kStateM) + b,
                     Ram(kStateV) + b,
                     {Bank(kStateMaster) + b, Bank(kStateM) + b, Bank(kStateV) + b}, out,
                     static_cast<size_t>(e - b));
  });
}

void TieredOptimizerState::Impl::ForRamTiles(
    const std::function<void(int64_t sg, int64_t begin, int64_t end)>& fn,
    const std::function<void()>& pump) const {
  const int64_t groups = layout.ram_sub_groups();
  if (groups == 0) return;
  // Only the last sub-group of all may be shorter, so tile i of the RAM
  // sub-groups is tile i % per of sub-group i / per.
  const int64_t per = layout.tiles(0);
  const int64_t count = (groups - 1) * per + layout.tiles(groups - 1);
  RunTiles(
      pool, count,
      [&](int, int64_t i) {
        const int64_t sg = i / per;
        const int64_t begin = (i % per) * kTileElems;
        fn(sg, begin, std::min(layout.size(sg), begin + kTileElems));
      },
      pump);
}

absl::Status TieredOptimizerState::Impl::CheckRange(absl::string_view what, int64_t offset,
                                                    int64_t len) const {
  if (offset < 0 || len < 0 || offset > layout.total_elems() - len) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": elements [", offset, ", ", offset + len,
                                                   ") are outside the state's [0, ",
                                                   layout.total_elems(), ")"));
  }
  return absl::OkStatus();
}

absl::Status TieredOptimizerState::Impl::NeedsRestore() const {
  return absl::FailedPreconditionError(
      absl::StrCat("the optimizer state needs restore (LoadMaster or WriteState of every element; ",
                   layout.total_elems() - restored.size(), " of ", layout.total_elems(),
                   " not yet rewritten) after: ", absl::StatusCodeToString(error.code()), ": ",
                   error.message()));
}

absl::Status TieredOptimizerState::Impl::Record(absl::string_view what, absl::Status status) {
  if (status.ok()) return status;
  status = Failed(what, status);
  if (error.ok()) error = status;  // the first failure is the one to report
  restored.Clear();
  return status;
}

void TieredOptimizerState::Impl::AddRestored(int64_t begin, int64_t end) {
  restored.Add(begin, end);
  if (restored.size() == layout.total_elems()) {
    error = absl::OkStatus();
    restored.Clear();
  }
}

absl::Status TieredOptimizerState::Impl::Write(absl::string_view what, int64_t offset, int64_t len,
                                               const PieceFn& fill) {
  ZO_RETURN_IF_ERROR(CheckRange(what, offset, len));
  speculated.Clear();  // computed from what is being replaced
  const bool healthy = error.ok();
  for (int64_t pos = offset; pos < offset + len;) {
    const int64_t sg = pos / layout.sub_group_elems();
    const int64_t begin = pos - layout.begin(sg);
    const int64_t n = std::min(offset + len - pos, layout.size(sg) - begin);
    if (sg < layout.ram_sub_groups()) {
      const int64_t at = pos;
      fill(sg, Ram(kStateMaster) + at, Ram(kStateM) + at, Ram(kStateV) + at, pos - offset, n);
    } else {
      const int64_t slot = sg - layout.ram_sub_groups();
      char* buf = buffers->buffer(0);
      if (begin == 0 && n == layout.size(sg)) {
        file->ZeroPadding(slot, buf);  // the whole sub-group: nothing to keep
      } else {
        // While restoring, blocks not yet rewritten may be the bad ones.
        absl::Status read = pipeline->ReadSlot(slot, buf, /*verify=*/healthy);
        if (!read.ok()) return Record(what, std::move(read));
      }
      fill(sg, file->Array(buf, kStateMaster) + begin, file->Array(buf, kStateM) + begin,
           file->Array(buf, kStateV) + begin, pos - offset, n);
      absl::Status written = pipeline->WriteSlot(slot, buf);
      if (!written.ok()) return Record(what, std::move(written));
    }
    pos += n;
  }
  if (!healthy) AddRestored(offset, offset + len);
  return absl::OkStatus();
}

absl::Status TieredOptimizerState::Impl::Read(int64_t offset, int64_t len,
                                              const PieceFn& copy_out) {
  if (!error.ok()) return NeedsRestore();
  ZO_RETURN_IF_ERROR(CheckRange("ReadState", offset, len));
  for (int64_t pos = offset; pos < offset + len;) {
    const int64_t sg = pos / layout.sub_group_elems();
    const int64_t begin = pos - layout.begin(sg);
    const int64_t n = std::min(offset + len - pos, layout.size(sg) - begin);
    if (sg < layout.ram_sub_groups()) {
      copy_out(sg, Ram(kStateMaster) + pos, Ram(kStateM) + pos, Ram(kStateV) + pos, pos - offset,
               n);
    } else {
      char* buf = buffers->buffer(0);
      absl::Status read = pipeline->ReadSlot(sg - layout.ram_sub_groups(), buf, /*verify=*/true);
      if (!read.ok()) return Record("ReadState", std::move(read));
      copy_out(sg, file->Array(buf, kStateMaster) + begin, file->Array(buf, kStateM) + begin,
               file->Array(buf, kStateV) + begin, pos - offset, n);
    }
    pos += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TieredOptimizerState>> TieredOptimizerState::Create(
    const TieredStateOptions& options, int64_t total_elems, ThreadPool* pool) {
  return Create(options, total_elems, pool, TieredStateSeams{});
}

absl::StatusOr<std::unique_ptr<TieredOptimizerState>> TieredOptimizerState::Create(
    const TieredStateOptions& options, int64_t total_elems, ThreadPool* pool,
    TieredStateSeams seams) {
  auto impl = std::make_unique<Impl>(options, std::max<int64_t>(total_elems, 0), pool);
  ZO_RETURN_IF_ERROR(ValidateOptions(options, impl->layout, total_elems, pool));
  const SwapLayout& layout = impl->layout;

  const auto ram_bytes = static_cast<size_t>(layout.ram_elems()) * sizeof(float);
  if (ram_bytes > 0) {
    for (AlignedBuffer& array : impl->ram) {
      ZO_ASSIGN_OR_RETURN(array, AlignedBuffer::Allocate(ram_bytes));
    }
    // First touch by the worker that will update each tile.
    impl->ForRamTiles(
        [&](int64_t sg, int64_t begin, int64_t end) {
          const int64_t at = layout.begin(sg) + begin;
          for (int a = 0; a < kStateArrays; ++a) {
            std::memset(impl->Ram(a) + at, 0, static_cast<size_t>(end - begin) * sizeof(float));
          }
        },
        nullptr);
  }

  if (layout.nvme_sub_groups() > 0) {
    ZO_ASSIGN_OR_RETURN(impl->file, SwapFile::Create(layout, options.swap_dir, options.checksums,
                                                     seams.preallocate));
    if (seams.make_engine) {
      ZO_ASSIGN_OR_RETURN(impl->engine, seams.make_engine(options.io));
    } else {
      ZO_ASSIGN_OR_RETURN(impl->engine, CreateIoEngine(options.io));
    }
    ZO_RETURN_IF_ERROR(impl->engine->RegisterFile(impl->file->fd(), impl->file->path()));
    const auto count =
        static_cast<size_t>(std::min<int64_t>(options.buffer_count, layout.nvme_sub_groups()));
    ZO_ASSIGN_OR_RETURN(impl->buffers, AlignedBufferPool::Create(count, layout.slot_bytes()));
    ZO_RETURN_IF_ERROR(impl->engine->RegisterBuffers(*impl->buffers));
    impl->pipeline = std::make_unique<SwapPipeline>(impl->engine.get(), impl->file.get(),
                                                    impl->buffers.get(), pool);
  }
  return std::unique_ptr<TieredOptimizerState>(new TieredOptimizerState(std::move(impl)));
}

TieredOptimizerState::TieredOptimizerState(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SwapIoStats TieredOptimizerState::swap_io_stats() const {
  return impl_->pipeline == nullptr ? SwapIoStats{} : impl_->pipeline->io_stats();
}

int64_t TieredOptimizerState::ram_bytes() const {
  int64_t bytes = 0;
  for (const AlignedBuffer& array : impl_->ram) bytes += static_cast<int64_t>(array.size());
  for (const AlignedBuffer& array : impl_->bank) bytes += static_cast<int64_t>(array.size());
  if (impl_->buffers != nullptr) {
    bytes += static_cast<int64_t>(impl_->buffers->count() * impl_->buffers->buffer_bytes());
  }
  return bytes;
}

TieredOptimizerState::~TieredOptimizerState() = default;

int64_t TieredOptimizerState::total_elems() const { return impl_->layout.total_elems(); }
int64_t TieredOptimizerState::num_sub_groups() const { return impl_->layout.num_sub_groups(); }
int64_t TieredOptimizerState::ram_sub_groups() const { return impl_->layout.ram_sub_groups(); }
int64_t TieredOptimizerState::nvme_sub_groups() const { return impl_->layout.nvme_sub_groups(); }
int64_t TieredOptimizerState::ram_elems() const { return impl_->layout.ram_elems(); }
bool TieredOptimizerState::tiles_on_grid() const {
  const SwapLayout& layout = impl_->layout;
  return layout.num_sub_groups() <= 1 || layout.sub_group_elems() % kTileElems == 0;
}

const float* TieredOptimizerState::ram_master() const { return impl_->Ram(kStateMaster); }
const float* TieredOptimizerState::ram_m() const { return impl_->Ram(kStateM); }
const float* TieredOptimizerState::ram_v() const { return impl_->Ram(kStateV); }

absl::Status TieredOptimizerState::LoadMaster(int64_t offset, absl::Span<const float> values) {
  return impl_->Write("LoadMaster", offset, static_cast<int64_t>(values.size()),
                      [&](int64_t, float* p, float* m, float* v, int64_t src, int64_t n) {
                        const auto bytes = static_cast<size_t>(n) * sizeof(float);
                        std::memcpy(p, values.data() + src, bytes);
                        std::memset(m, 0, bytes);
                        std::memset(v, 0, bytes);
                      });
}

absl::Status TieredOptimizerState::ReadState(int64_t offset, absl::Span<float> master,
                                             absl::Span<float> m, absl::Span<float> v) {
  const size_t len = std::max({master.size(), m.size(), v.size()});
  for (absl::Span<float> s : {master, m, v}) {
    if (!s.empty() && s.size() != len) {
      return absl::InvalidArgumentError(absl::StrCat("ReadState: spans of ", master.size(), ", ",
                                                     m.size(), " and ", v.size(),
                                                     " elements; non-empty ones must match"));
    }
  }
  return impl_->Read(
      offset, static_cast<int64_t>(len),
      [&](int64_t, const float* p, const float* pm, const float* pv, int64_t dst, int64_t n) {
        const auto bytes = static_cast<size_t>(n) * sizeof(float);
        if (!master.empty()) std::memcpy(master.data() + dst, p, bytes);
        if (!m.empty()) std::memcpy(m.data() + dst, pm, bytes);
        if (!v.empty()) std::memcpy(v.data() + dst, pv, bytes);
      });
}

absl::Status TieredOptimizerState::WriteState(int64_t offset, absl::Span<const float> master,
                                              absl::Span<const float> m,
                                              absl::Span<const float> v) {
  if (m.size() != master.size() || v.size() != master.size()) {
    return absl::InvalidArgumentError(absl::StrCat("WriteState: spans of ", master.size(), ", ",
                                                   m.size(), " and ", v.size(),
                                                   " elements; all three must match"));
  }
  return impl_->Write("WriteState", offset, static_cast<int64_t>(master.size()),
                      [&](int64_t, float* p, float* pm, float* pv, int64_t src, int64_t n) {
                        const auto bytes = static_cast<size_t>(n) * sizeof(float);
                        std::memcpy(p, master.data() + src, bytes);
                        std::memcpy(pm, m.data() + src, bytes);
                        std::memcpy(pv, v.data() + src, bytes);
                      });
}

absl::Status TieredOptimizerState::AdamStep(const AdamStepConstants& c, TypedConstPtr grad,
                                            TypedPtr low_precision,
                                            const std::function<void(int64_t end)>& updated,
                                            const StateObserver& before_update,
                                            const TileUpdated& tile_updated,
                                            std::optional<DType> old_weights_dtype) {
  return AdamStep(RangedConstants<AdamStepConstants>(c), grad, low_precision, updated,
                  before_update, tile_updated, old_weights_dtype);
}

absl::Status TieredOptimizerState::AdamStep(const RangedConstants<AdamStepConstants>& c,
                                            const GradientSource& grad, TypedPtr low_precision,
                                            const std::function<void(int64_t end)>& updated,
                                            const StateObserver& before_update,
                                            const TileUpdated& tile_updated,
                                            std::optional<DType> old_weights_dtype) {
  Impl& s = *impl_;
  if (!s.error.ok()) return s.NeedsRestore();
  if (s.layout.total_elems() == 0) return absl::OkStatus();
  if (grad.empty()) return absl::InvalidArgumentError("AdamStep: no gradient");
  s.speculated.Clear();  // computed from the state this step replaces
  if (old_weights_dtype.has_value() && tile_updated && low_precision.data != nullptr) {
    return absl::InvalidArgumentError(
        "AdamStep: a low-precision copy and tile_updated's old weights cannot both be written");
  }
  const SwapLayout& layout = s.layout;
  // One kernel call per tile, RAM or NVMe alike: the same bits either way.
  const TileKernel kernel = [&](int64_t sg, int64_t begin, int64_t end, float* p, float* m,
                                float* v) {
    const auto at = static_cast<size_t>(layout.begin(sg) + begin);
    const auto n = static_cast<size_t>(end - begin);
    if (before_update) {
      before_update(static_cast<int64_t>(at), end - begin, p + begin, m + begin, v + begin);
    }
    // Run by run within the tile: [b, e) in the state's flat index space.
    const auto each_run = [&](const auto& update) {
      c.ForEach(static_cast<int64_t>(at), static_cast<int64_t>(at + n),
                [&](int64_t b, int64_t e, const AdamStepConstants& k) {
                  const auto i = static_cast<size_t>(b) - at;  // into the tile
                  update(k, static_cast<size_t>(b), begin + static_cast<int64_t>(i), i,
                         static_cast<size_t>(e - b));
                });
    };
    if (!tile_updated || !old_weights_dtype.has_value()) {
      each_run([&](const AdamStepConstants& k, size_t flat, int64_t local, size_t, size_t len) {
        AdamUpdate(k, grad.At(static_cast<int64_t>(flat), static_cast<int64_t>(len)), p + local,
                   m + local, v + local, OffsetBy(low_precision, flat), len);
      });
      if (tile_updated) {
        tile_updated({.offset = static_cast<int64_t>(at),
                      .n = end - begin,
                      .old_weights = nullptr,
                      .p = p + begin,
                      .m = m + begin,
                      .v = v + begin});
      }
      return;
    }
    // The old weights of one tile at a time, per worker: a tile's worth of
    // scratch instead of a copy of every weight.
    thread_local std::vector<float> old_weights;
    old_weights.resize((n * DTypeSize(*old_weights_dtype) + sizeof(float) - 1) / sizeof(float));
    each_run([&](const AdamStepConstants& k, size_t flat, int64_t local, size_t i, size_t len) {
      AdamUpdate(k, grad.At(static_cast<int64_t>(flat), static_cast<int64_t>(len)), p + local,
                 m + local, v + local,
                 OffsetBy(TypedPtr{old_weights.data(), *old_weights_dtype}, i), len,
                 CopyOf::kOldWeight);
    });
    tile_updated({.offset = static_cast<int64_t>(at),
                  .n = end - begin,
                  .old_weights = old_weights.data(),
                  .p = p + begin,
                  .m = m + begin,
                  .v = v + begin});
  };
  const OverlapFn ram_pass = [&](const std::function<void()>& pump) {
    s.ForRamTiles(
        [&](int64_t sg, int64_t begin, int64_t end) {
          const int64_t base = layout.begin(sg);
          kernel(sg, begin, end, s.Ram(kStateMaster) + base, s.Ram(kStateM) + base,
                 s.Ram(kStateV) + base);
        },
        pump);
  };
  if (s.pipeline == nullptr) {
    ram_pass(nullptr);
    if (updated) updated(layout.total_elems());
    return absl::OkStatus();
  }
  const int64_t ram_groups = layout.ram_sub_groups();
  const OverlapFn ram_pass_then_report = [&](const std::function<void()>& pump) {
    ram_pass(pump);
    if (updated && ram_groups > 0)
      updated(layout.begin(ram_groups - 1) + layout.size(ram_groups - 1));
  };
  const auto slot_done = [&](int64_t slot) {
    const int64_t sg = ram_groups + slot;
    if (updated) updated(layout.begin(sg) + layout.size(sg));
  };
  // The RAM sub-groups are updated while the first NVMe reads are in flight.
  return s.Record("AdamStep", s.pipeline->Run(&kernel, ram_pass_then_report, slot_done));
}

absl::Status TieredOptimizerState::ReserveSpeculation() {
  Impl& s = *impl_;
  if (s.layout.nvme_sub_groups() > 0) {
    return absl::UnimplementedError(absl::StrCat(
        "a speculative update needs the optimizer state in RAM; ", s.layout.nvme_sub_groups(),
        " of ", s.layout.num_sub_groups(), " sub-groups lie on NVMe"));
  }
  if (speculation_reserved() || s.layout.total_elems() == 0) return absl::OkStatus();
  const auto bytes = static_cast<size_t>(s.layout.ram_elems()) * sizeof(float);
  AlignedBuffer bank[kStateArrays];
  for (AlignedBuffer& array : bank) {
    ZO_ASSIGN_OR_RETURN(array, AlignedBuffer::Allocate(bytes));
  }
  // First touch by the worker that will write each tile.
  s.ForRamTiles(
      [&](int64_t sg, int64_t begin, int64_t end) {
        const int64_t at = s.layout.begin(sg) + begin;
        for (AlignedBuffer& array : bank) {
          std::memset(array.as<float>() + at, 0, static_cast<size_t>(end - begin) * sizeof(float));
        }
      },
      nullptr);
  std::vector<AlignedBuffer> scratch(static_cast<size_t>(s.pool->size()));
  for (AlignedBuffer& tile : scratch) {
    ZO_ASSIGN_OR_RETURN(tile, AlignedBuffer::Allocate(kTileElems * sizeof(float)));
  }
  for (int a = 0; a < kStateArrays; ++a) s.bank[a] = std::move(bank[a]);
  s.rounded_scratch = std::move(scratch);
  return absl::OkStatus();
}

bool TieredOptimizerState::speculation_reserved() const {
  return impl_->bank[kStateMaster].size() > 0;
}

int64_t TieredOptimizerState::speculated_elems() const { return impl_->speculated.size(); }

absl::Status TieredOptimizerState::SpeculateAdam(const RangedConstants<AdamStepConstants>& c,
                                                 const GradientSource& grad, int64_t offset,
                                                 int64_t n, std::optional<DType> rounded,
                                                 const TileRounded& tile_rounded,
                                                 bool all_workers) {
  Impl& s = *impl_;
  if (!s.error.ok()) return s.NeedsRestore();
  if (!speculation_reserved() && s.layout.total_elems() > 0) {
    return absl::FailedPreconditionError("SpeculateAdam: no bank reserved (ReserveSpeculation)");
  }
  ZO_RETURN_IF_ERROR(s.CheckRange("SpeculateAdam", offset, n));
  if (n == 0) return absl::OkStatus();
  if (grad.empty()) return absl::InvalidArgumentError("SpeculateAdam: no gradient");
  // Pieces end on the tile grid, so that all but a range's first are
  // aligned for the kernel's streaming stores.
  const int64_t first = offset / kTileElems;
  const int64_t count = (offset + n - 1) / kTileElems - first + 1;
  // While the workers push the step's other gradients and the server
  // copies them on their threads or its handlers', one core stays theirs
  // (2 cores, 32 Mi bf16 parameters pushed as copies, a compute as long as
  // the step: speculating on both made the step 1.8-1.95x max(compute,
  // step alone), on one 1.57-1.65x; zo-bench offload --compute-ms auto).
  RunTiles(
      s.pool, count,
      [&](int worker, int64_t i) {
        const int64_t begin = std::max(offset, (first + i) * kTileElems);
        const int64_t end = std::min(offset + n, (first + i + 1) * kTileElems);
        if (!rounded.has_value()) {
          s.UpdateBeside(c, grad, begin, end);
          return;
        }
        void* tile = s.rounded_scratch[static_cast<size_t>(worker)].data();
        s.UpdateBeside(c, grad, begin, end, {tile, *rounded});
        if (tile_rounded) tile_rounded({.offset = begin, .n = end - begin, .weights = tile});
      },
      nullptr, all_workers ? s.pool->size() : std::max(1, s.pool->size() - 1));
  s.speculated.Add(offset, offset + n);
  return absl::OkStatus();
}

absl::Status TieredOptimizerState::CommitSpeculation(const RangedConstants<AdamStepConstants>& c,
                                                     const GradientSource& grad,
                                                     const StateObserver& before_update,
                                                     const TileUpdated& tile_updated) {
  Impl& s = *impl_;
  if (!s.error.ok()) return s.NeedsRestore();
  if (s.layout.total_elems() == 0) return absl::OkStatus();
  if (!speculation_reserved()) {
    return absl::FailedPreconditionError(
        "CommitSpeculation: no bank reserved (ReserveSpeculation)");
  }
  if (grad.empty()) return absl::InvalidArgumentError("CommitSpeculation: no gradient");
  const SwapLayout& layout = s.layout;
  if (before_update) {
    s.ForRamTiles(
        [&](int64_t sg, int64_t begin, int64_t end) {
          const int64_t at = layout.begin(sg) + begin;
          before_update(at, end - begin, s.Ram(kStateMaster) + at, s.Ram(kStateM) + at,
                        s.Ram(kStateV) + at);
        },
        nullptr);
  }
  // What was not speculated, in pieces on the tile grid shared evenly by
  // the workers (it is often one chunk: the last whose gradients came).
  std::vector<std::pair<int64_t, int64_t>> pieces;
  const auto add_gap = [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end;) {
      const int64_t e = std::min(end, (b / kTileElems + 1) * kTileElems);
      pieces.emplace_back(b, e);
      b = e;
    }
  };
  int64_t next = 0;
  s.speculated.ForEachIn(0, layout.total_elems(), [&](int64_t b, int64_t e) {
    add_gap(next, b);
    next = e;
  });
  add_gap(next, layout.total_elems());
  RunTiles(s.pool, static_cast<int64_t>(pieces.size()), [&](int, int64_t i) {
    const auto [begin, end] = pieces[static_cast<size_t>(i)];
    s.UpdateBeside(c, grad, begin, end);
  });
  for (int a = 0; a < kStateArrays; ++a) std::swap(s.ram[a], s.bank[a]);
  s.speculated.Clear();
  if (!tile_updated) return absl::OkStatus();
  s.ForRamTiles(
      [&](int64_t sg, int64_t begin, int64_t end) {
        const int64_t at = layout.begin(sg) + begin;
        tile_updated({.offset = at,
                      .n = end - begin,
                      .old_weights = nullptr,
                      .p = s.Ram(kStateMaster) + at,
                      .m = s.Ram(kStateM) + at,
                      .v = s.Ram(kStateV) + at});
      },
      nullptr);
  return absl::OkStatus();
}

void TieredOptimizerState::DiscardSpeculation() { impl_->speculated.Clear(); }

absl::Status TieredOptimizerState::ObserveNvme(const StateObserver& observer) {
  Impl& s = *impl_;
  if (!s.error.ok()) return s.NeedsRestore();
  if (s.pipeline == nullptr) return absl::OkStatus();
  const SwapLayout& layout = s.layout;
  const TileKernel kernel = [&](int64_t sg, int64_t begin, int64_t end, float* p, float* m,
                                float* v) {
    observer(layout.begin(sg) + begin, end - begin, p + begin, m + begin, v + begin);
  };
  return s.Record("ObserveNvme", s.pipeline->Run(&kernel, nullptr));
}

absl::Status TieredOptimizerState::IoOnlyPass() {
  Impl& s = *impl_;
  if (!s.error.ok()) return s.NeedsRestore();
  if (s.pipeline == nullptr) return absl::OkStatus();
  return s.Record("IoOnlyPass", s.pipeline->Run(nullptr, nullptr));
}

absl::Status TieredOptimizerState::health() const { return impl_->error; }

std::string TieredOptimizerState::swap_path() const {
  return impl_->file ? impl_->file->path() : std::string();
}

std::string_view TieredOptimizerState::io_engine_name() const {
  return impl_->engine ? impl_->engine->name() : std::string_view();
}

}  // namespace zo
