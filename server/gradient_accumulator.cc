#include "server/gradient_accumulator.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/status_macros.h"
#include "rpc/error_detail.h"

namespace zo {

absl::StatusOr<std::unique_ptr<GradientAccumulator>> GradientAccumulator::Create(Options options) {
  if (options.wakes == nullptr) {
    return absl::InvalidArgumentError("a GradientAccumulator needs a WakeQueue for waiting pushes");
  }
  // Coverage keeps a range list per contributor and chunk.
  constexpr int64_t kMaxContributors = 1 << 16;
  if (options.dp_world_size < 1 || options.pushes_per_rank < 1 ||
      int64_t{options.dp_world_size} * options.pushes_per_rank > kMaxContributors) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job ", options.job, ": ", options.dp_world_size, " dp ranks x ", options.pushes_per_rank,
        " pushes per step must be between 1 and ", kMaxContributors));
  }
  std::unique_ptr<GradientAccumulator> a(new GradientAccumulator(std::move(options)));
  const DType gdtype = a->gradient_dtype();
  const size_t gsize = DTypeSize(gdtype);
  ZO_ASSIGN_OR_RETURN(
      a->accum_,
      AlignedBuffer::Allocate(static_cast<size_t>(std::max<int64_t>(a->local_elems_, 1)) * gsize));
  std::vector<OptimizerChunk> views;
  for (const LocalChunk& c : a->chunks_) {
    OptimizerChunk v;
    v.grad = {a->accum_.as<char>() + c.local_offset * static_cast<int64_t>(gsize), gdtype};
    v.n = static_cast<size_t>(c.elems);
    views.push_back(v);
    a->chunk_mu_.push_back(std::make_unique<absl::Mutex>());
  }
  a->view_ = std::make_unique<CpuOptimizer>(a->pool_, std::move(views));
  if (!a->chunks_.empty()) a->view_->FirstTouchZero();
  return a;
}

namespace {

// "[begin, begin + n)" for a message; the sum cannot overflow, since
// `begin` comes off the wire and may be anything.
std::string ElementRange(int64_t begin, int64_t n) {
  int64_t end;
  if (__builtin_add_overflow(begin, n, &end))
    return absl::StrCat("[", begin, ", ", begin, " + ", n, ")");
  return absl::StrCat("[", begin, ", ", end, ")");
}

int64_t SumElems(const std::vector<LocalChunk>& chunks) {
  int64_t n = 0;
  for (const LocalChunk& c : chunks) n += c.elems;
  return n;
}

// A chunk's statistics blocks are the gradient blocks when it starts on one.
bool ChunksStartOnBlocks(const std::vector<LocalChunk>& chunks) {
  return std::all_of(chunks.begin(), chunks.end(),
                     [](const LocalChunk& c) { return c.local_offset % kGradientBlockElems == 0; });
}

}  // namespace

GradientAccumulator::GradientAccumulator(Options options)
    : job_(std::move(options.job)),
      chunks_(std::move(options.chunks)),
      local_elems_(SumElems(chunks_)),
      dp_world_size_(options.dp_world_size),
      pushes_per_rank_(options.pushes_per_rank),
      dtype_(options.dtype),
      pool_(options.pool),
      wakes_(options.wakes),
      track_filled_(options.track_filled),
      reads_lent_(options.reads_lent && dp_world_size_ * pushes_per_rank_ == 1 &&
                  ChunksStartOnBlocks(chunks_)),
      on_ready_(std::move(options.on_ready)) {
  if (reads_lent_) {
    lent_blocks_.assign(
        static_cast<size_t>((local_elems_ + kGradientBlockElems - 1) / kGradientBlockElems),
        nullptr);
  }
  absl::MutexLock lock(&mu_);
  for (const LocalChunk& c : chunks_) coverage_.emplace_back(c.elems, contributors());
  chunk_step_.assign(chunks_.size(), 1);
  chunk_adding_.assign(chunks_.size(), 0);
  chunk_filled_.assign(chunks_.size(), false);
  waiters_.resize(chunks_.size());
  lent_owners_.resize(chunks_.size());
}

absl::StatusOr<GradientAccumulator::PushOutcome> GradientAccumulator::TryPush(
    int index, const GradientPieceView& piece, PushWait* wait, std::function<void()> wake,
    std::shared_ptr<const void> lent) {
  if (piece.dp_rank < 0 || piece.dp_rank >= dp_world_size_) {
    return absl::InvalidArgumentError(absl::StrCat("dp_rank ", piece.dp_rank, " is outside [0, ",
                                                   dp_world_size_, ") for job ", job_));
  }
  if (piece.micro_batch < 0 || piece.micro_batch >= pushes_per_rank_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro_batch ", piece.micro_batch, " is outside [0, ", pushes_per_rank_, ") for job ", job_,
        pushes_per_rank_ == 1 ? " (it sums micro-batches on the workers: zo.gradient_accumulation "
                                "is not \"servers\")"
                              : ""));
  }
  // Each (rank, micro-batch) delivers every element once.
  const int contributor = piece.dp_rank * pushes_per_rank_ + piece.micro_batch;
  const LocalChunk& c = chunks_[static_cast<size_t>(index)];
  const size_t elem = DTypeSize(dtype_);
  if (piece.data_bytes == 0 || piece.data_bytes % elem != 0) {
    return absl::InvalidArgumentError(absl::StrCat("gradient piece for chunk ", piece.chunk, ": ",
                                                   piece.data_bytes,
                                                   " bytes is not a positive multiple of the ",
                                                   std::string(DTypeName(dtype_)), " size ", elem));
  }
  const int64_t n = static_cast<int64_t>(piece.data_bytes / elem);
  if (piece.offset < 0 || piece.offset > c.elems - n) {
    return absl::OutOfRangeError(absl::StrCat("gradient piece: elements ",
                                              ElementRange(piece.offset, n), " are outside chunk ",
                                              piece.chunk, " of ", c.elems, " elements"));
  }

  std::vector<FlatRange> gaps;
  {
    absl::MutexLock lock(&mu_);
    wait->ticket = WaitList::kNone;
    ZO_RETURN_IF_ERROR(closed_);
    if (wait->resets < 0) wait->resets = resets_;
    if (wait->resets != resets_) {
      return absl::AbortedError(absl::StrCat("job ", job_, " was restored to version ",
                                             chunk_step_[index] - 1, " while this push waited"));
    }
    // A push for the next step waits until this chunk's update is done.
    if (piece.step == chunk_step_[index] + 1) {
      wait->ticket = waiters_[index].Add(piece.step, std::move(wake));
      return PushOutcome::kWaiting;
    }
    if (piece.step != chunk_step_[index]) {
      return WithDetail(
          absl::FailedPreconditionError(absl::StrCat(
              "step ", piece.step, " is not open: job ", job_, " takes gradients for step ",
              chunk_step_[index], " in chunk ", piece.chunk)),
          MakeDetail(v1::ErrorDetail::STEP_NOT_OPEN, job_, chunk_step_[index]));
    }
    ChunkCoverage& coverage = coverage_[index];
    const bool was_complete = coverage.complete();
    ZO_ASSIGN_OR_RETURN(gaps,
                        coverage.Claim(contributor, piece.offset, piece.offset + n, piece.resend));
    if (!was_complete && coverage.complete()) ++complete_chunks_;
    ++adding_;
    ++chunk_adding_[index];
  }
  bool kept = false;
  bool copied = false;
  if (StoresGradients()) {
    // Coverage gave this rank's elements to this push alone: no lock.
    char* slot = accum_.as<char>() + c.local_offset * static_cast<int64_t>(elem);
    const bool keeps = reads_lent_ && lent != nullptr && piece.data.size() == 1;
    for (const FlatRange& g : gaps) {
      char* dst = slot + g.begin * static_cast<int64_t>(elem);
      const size_t from = static_cast<size_t>(g.begin - piece.offset) * elem;
      // Written in place (LendPlace): nothing to copy.
      if (piece.data.size() == 1 && piece.data[0].data() + from == dst) continue;
      if (keeps && KeepLent(c, g.begin, g.end,
                            reinterpret_cast<const std::byte*>(piece.data[0].data()) + from)) {
        kept = true;
        continue;
      }
      CopySegments(piece.data, from, static_cast<size_t>(g.size()) * elem, dst);
      copied = true;
    }
  } else {
    copied = !gaps.empty();
    absl::MutexLock chunk_lock(chunk_mu_[index].get());
    float* acc = accum_.as<float>() + c.local_offset;
    for (const FlatRange& g : gaps) {
      AccumulateSegments(piece.data, dtype_, static_cast<size_t>(g.begin - piece.offset),
                         static_cast<size_t>(g.size()), acc + g.begin);
    }
  }
  bool ready;
  {
    absl::MutexLock lock(&mu_);
    if (kept) lent_owners_[index].push_back(std::move(lent));
    if (copied) copied_step_ = std::max(copied_step_, piece.step);
    --adding_;
    bool filled = false;
    if (--chunk_adding_[index] == 0 && track_filled_ && coverage_[index].complete() &&
        !chunk_filled_[index]) {
      chunk_filled_[index] = true;
      filled_.push_back(index);
      filled = true;
    }
    ready = filled || (adding_ == 0 && complete_chunks_ == static_cast<int>(chunks_.size()));
  }
  if (ready && on_ready_) on_ready_();
  return PushOutcome::kAdded;
}

bool GradientAccumulator::CancelWait(int index, const PushWait& wait) {
  absl::MutexLock lock(&mu_);
  return waiters_[static_cast<size_t>(index)].Remove(wait.ticket);
}

absl::Status GradientAccumulator::Push(int index, const GradientPieceView& piece,
                                       absl::Time deadline) {
  PushWait wait;
  for (;;) {
    // Shared with the wake, which may run after this call gave up.
    auto woken = std::make_shared<absl::Notification>();
    ZO_ASSIGN_OR_RETURN(const PushOutcome outcome,
                        TryPush(index, piece, &wait, [woken] { woken->Notify(); }));
    if (outcome == PushOutcome::kAdded) return absl::OkStatus();
    if (!woken->WaitForNotificationWithDeadline(deadline) && CancelWait(index, wait)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "step ", piece.step, " of job ", job_, " waited until the deadline for step ",
          piece.step - 1, " to finish updating chunk ", piece.chunk));
    }
  }
}

bool GradientAccumulator::Ready() const {
  absl::MutexLock lock(&mu_);
  return closed_.ok() && adding_ == 0 && complete_chunks_ == static_cast<int>(chunks_.size());
}

std::vector<int> GradientAccumulator::TakeFilled() {
  absl::MutexLock lock(&mu_);
  return std::exchange(filled_, {});
}

bool GradientAccumulator::has_filled() const {
  absl::MutexLock lock(&mu_);
  return !filled_.empty();
}

bool GradientAccumulator::CopiedPushes(int64_t step) const {
  absl::MutexLock lock(&mu_);
  return copied_step_ >= step;
}

int GradientAccumulator::waiting() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const WaitList& w : waiters_) n += w.size();
  return n;
}

absl::Span<std::byte> GradientAccumulator::LendPlace(int index, int64_t step, int64_t offset,
                                                     int64_t n) {
  if (!StoresGradients() || index < 0 || index >= static_cast<int>(chunks_.size())) return {};
  const LocalChunk& c = chunks_[static_cast<size_t>(index)];
  if (n <= 0 || offset < 0 || offset > c.elems - n) return {};
  absl::MutexLock lock(&mu_);
  if (!closed_.ok() || chunk_step_[index] != step ||
      coverage_[index].DeliveredAny(0, offset, offset + n)) {
    return {};
  }
  const auto elem = static_cast<int64_t>(DTypeSize(dtype_));
  return {accum_.as<std::byte>() + (c.local_offset + offset) * elem, static_cast<size_t>(n * elem)};
}

CpuOptimizer::GradBlockReader GradientAccumulator::StatsReader() const {
  if (!reads_lent_) return {};  // every gradient is in the buffer
  // A chunk starts on a gradient block (reads_lent_), so each statistics
  // block is one.
  return [this, g = gradients()](size_t chunk, size_t begin, size_t n) {
    return g.At(chunks_[chunk].local_offset + static_cast<int64_t>(begin), static_cast<int64_t>(n));
  };
}

StepGradStats GradientAccumulator::Stats() const {
  if (chunks_.empty()) return {};
  return view_->ComputeGradStats(StatsReader());
}

StepGradStats GradientAccumulator::Stats(const std::vector<std::optional<GradStats>>& known) const {
  if (chunks_.empty()) return {};
  return view_->ComputeGradStats(known, StatsReader());
}

std::vector<GradStats> GradientAccumulator::ChunkStats(const std::vector<int>& which,
                                                       bool all_workers) const {
  return view_->ComputeChunkGradStats(which, all_workers ? 0 : 1, StatsReader());
}

void GradientAccumulator::Release(size_t begin, size_t end, int64_t step) {
  if (begin >= end) return;
  if (!StoresGradients()) {
    Zero(chunks_[begin].local_offset, chunks_[end - 1].local_offset + chunks_[end - 1].elems);
  }
  std::vector<std::shared_ptr<const void>> returned;
  absl::MutexLock lock(&mu_);
  for (size_t i = begin; i < end; ++i) {
    ForgetLentLocked(i, &returned);
    if (coverage_[i].complete()) --complete_chunks_;
    coverage_[i].Reset();
    if (chunk_filled_[i]) std::erase(filled_, static_cast<int>(i));
    chunk_filled_[i] = false;
    chunk_step_[i] = step + 1;
    wakes_->Post(waiters_[i].TakeAll());
  }
}

size_t GradientAccumulator::ReleaseBelow(size_t next, int64_t end_elem, int64_t step) {
  size_t done = next;
  while (done < chunks_.size() && chunks_[done].local_offset + chunks_[done].elems <= end_elem) {
    ++done;
  }
  Release(next, done, step);
  return done;
}

void GradientAccumulator::Close(absl::Status status) {
  absl::MutexLock lock(&mu_);
  closed_ = std::move(status);
  for (WaitList& w : waiters_) wakes_->Post(w.TakeAll());
}

void GradientAccumulator::Reopen() {
  absl::MutexLock lock(&mu_);
  closed_ = absl::OkStatus();
}

void GradientAccumulator::Reset(int64_t step) {
  std::vector<std::shared_ptr<const void>> returned;
  {
    absl::MutexLock lock(&mu_);
    ++resets_;
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return adding_ == 0; };
    mu_.Await(absl::Condition(&idle));
    for (ChunkCoverage& c : coverage_) c.Reset();
    for (size_t i = 0; i < chunks_.size(); ++i) ForgetLentLocked(i, &returned);
    complete_chunks_ = 0;
    chunk_filled_.assign(chunks_.size(), false);
    filled_.clear();
    std::fill(chunk_step_.begin(), chunk_step_.end(), step);
    for (WaitList& w : waiters_) wakes_->Post(w.TakeAll());
  }
  Zero(0, local_elems_);
}

bool GradientAccumulator::KeepLent(const LocalChunk& c, int64_t begin, int64_t end,
                                   const std::byte* src) {
  const int64_t from = c.local_offset + begin;
  const int64_t to = c.local_offset + end;
  const int64_t first = (from + kGradientBlockElems - 1) / kGradientBlockElems;
  // The last block of all may be short: lent whole when the piece ends it.
  const int64_t last = to == local_elems_ ? (to + kGradientBlockElems - 1) / kGradientBlockElems
                                          : to / kGradientBlockElems;
  if (first >= last) return false;
  const auto elem = static_cast<int64_t>(DTypeSize(dtype_));
  std::byte* own = accum_.as<std::byte>();
  const int64_t head = first * kGradientBlockElems;
  const int64_t tail = std::min(to, last * kGradientBlockElems);
  std::memcpy(own + from * elem, src, static_cast<size_t>((head - from) * elem));
  std::memcpy(own + tail * elem, src + (tail - from) * elem,
              static_cast<size_t>((to - tail) * elem));
  for (int64_t b = first; b < last; ++b) {
    lent_blocks_[static_cast<size_t>(b)] = src + (b * kGradientBlockElems - from) * elem;
  }
  return true;
}

void GradientAccumulator::ForgetLentLocked(size_t index,
                                           std::vector<std::shared_ptr<const void>>* returned) {
  std::vector<std::shared_ptr<const void>>& owners = lent_owners_[index];
  if (owners.empty()) return;
  const LocalChunk& c = chunks_[index];
  const int64_t first = c.local_offset / kGradientBlockElems;
  const int64_t end = (c.local_offset + c.elems + kGradientBlockElems - 1) / kGradientBlockElems;
  std::fill(lent_blocks_.begin() + first, lent_blocks_.begin() + end, nullptr);
  for (std::shared_ptr<const void>& o : owners) returned->push_back(std::move(o));
  owners.clear();
}

void GradientAccumulator::Zero(int64_t begin, int64_t end) {
  if (begin >= end) return;
  // Each worker zeroes its own pieces (the first-touch partition), so a
  // whole-step release is as parallel as the update was.
  const int64_t size = static_cast<int64_t>(DTypeSize(gradient_dtype()));
  char* const base = accum_.as<char>();
  view_->ForEachSegment([&](const OptimizerChunk& c, size_t seg_begin, size_t seg_end) {
    const int64_t offset = (static_cast<const char*>(c.grad.data) - base) / size;
    const int64_t lo = std::max<int64_t>(begin, offset + static_cast<int64_t>(seg_begin));
    const int64_t hi = std::min<int64_t>(end, offset + static_cast<int64_t>(seg_end));
    if (lo < hi) std::memset(base + lo * size, 0, static_cast<size_t>((hi - lo) * size));
  });
}

}  // namespace zo
