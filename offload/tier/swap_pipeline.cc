#include "offload/tier/swap_pipeline.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "offload/tier/tile_runner.h"

namespace zo {
namespace {

// Tags carry the buffer index and whether the request was the write-back.
uint64_t Tag(int buffer, IoOp op) {
  return static_cast<uint64_t>(buffer) * 2 + (op == IoOp::kWrite ? 1 : 0);
}

}  // namespace

SwapPipeline::SwapPipeline(IoEngine* engine, SwapFile* file, AlignedBufferPool* buffers,
                           ThreadPool* pool)
    : engine_(engine), file_(file), buffers_(buffers), pool_(pool) {}

void SwapPipeline::Fail(absl::Status status) {
  if (error_.ok()) error_ = std::move(status);
}

void SwapPipeline::OnCompletion(const IoCompletion& done) {
  Buffer& buf = bufs_[done.tag / 2];
  const bool write = done.tag % 2 == 1;
  io_.Record(write, static_cast<int64_t>(file_->layout().slot_bytes()),
             std::chrono::steady_clock::now() - buf.submitted);
  if (!done.status.ok()) {
    Fail(file_->IoError(buf.slot, write ? IoOp::kWrite : IoOp::kRead, done.status));
  }
  if (write) {
    // Even a failed write may have changed the file: read it from now on.
    file_->set_written(buf.slot);
    buf = Buffer{};
  } else {
    buf.state = BufState::kReady;
  }
}

void SwapPipeline::Absorb(absl::StatusOr<std::vector<IoCompletion>> done) {
  if (!done.ok()) {
    Fail(done.status());
    return;
  }
  for (const IoCompletion& c : *done) OnCompletion(c);
}

void SwapPipeline::StartReads() {
  const SwapLayout& layout = file_->layout();
  while (error_.ok() && next_read_ < layout.nvme_sub_groups()) {
    auto it = std::find_if(bufs_.begin(), bufs_.end(),
                           [](const Buffer& b) { return b.state == BufState::kFree; });
    if (it == bufs_.end()) return;
    const int b = static_cast<int>(it - bufs_.begin());
    Buffer& buf = *it;
    buf.slot = next_read_++;
    buf.zero_fill = !file_->written(buf.slot);
    if (buf.zero_fill) {
      buf.state = BufState::kReady;
      continue;
    }
    buf.state = BufState::kReading;
    buf.submitted = std::chrono::steady_clock::now();
    const IoRequest read{IoOp::kRead,         file_->fd(),         layout.slot_offset(buf.slot),
                         buffers_->buffer(b), layout.slot_bytes(), Tag(b, IoOp::kRead)};
    absl::Status submitted = engine_->Submit({read});
    if (!submitted.ok()) {
      Fail(file_->IoError(buf.slot, IoOp::kRead, submitted));
      buf = Buffer{};
    }
  }
}

void SwapPipeline::Pump() {
  if (error_.ok() && engine_->in_flight() > 0) Absorb(engine_->Reap(0));
  StartReads();
}

int SwapPipeline::BufferOf(int64_t slot) const {
  for (size_t b = 0; b < bufs_.size(); ++b) {
    if (bufs_[b].slot == slot && bufs_[b].state != BufState::kFree) return static_cast<int>(b);
  }
  return -1;
}

std::optional<ChecksumMismatch> SwapPipeline::ForTiles(
    int64_t slot, const std::function<std::optional<ChecksumMismatch>(int64_t tile)>& fn,
    bool pump) {
  std::vector<std::optional<ChecksumMismatch>> found(static_cast<size_t>(pool_->size()));
  const int64_t tiles = file_->layout().tiles(file_->layout().sub_group_of_slot(slot));
  RunTiles(
      pool_, tiles,
      [&](int worker, int64_t tile) {
        // A worker stops at its first bad block: the run fails anyway.
        if (!found[worker]) found[worker] = fn(tile);
      },
      pump ? std::function<void()>([this] { Pump(); }) : nullptr);
  for (const auto& f : found) {
    if (f) return f;
  }
  return std::nullopt;
}

void SwapPipeline::Process(int buffer, const TileKernel* kernel) {
  const int64_t slot = bufs_[buffer].slot;
  const bool zero = bufs_[buffer].zero_fill;
  if (kernel == nullptr && !zero) return;  // bare I/O: write back what was read
  const SwapLayout& layout = file_->layout();
  const int64_t sg = layout.sub_group_of_slot(slot);
  const int64_t n = layout.size(sg);
  char* data = buffers_->buffer(buffer);
  float* p = file_->Array(data, kStateMaster);
  float* m = file_->Array(data, kStateM);
  float* v = file_->Array(data, kStateV);
  if (zero) file_->ZeroPadding(slot, data);
  std::optional<ChecksumMismatch> bad = ForTiles(
      slot,
      [&](int64_t tile) -> std::optional<ChecksumMismatch> {
        if (zero) {
          file_->ZeroTile(slot, tile, data);
        } else if (auto mismatch = file_->VerifyTile(slot, tile, data)) {
          return mismatch;
        }
        if (kernel != nullptr) {
          (*kernel)(sg, tile * kTileElems, std::min(n, (tile + 1) * kTileElems), p, m, v);
        }
        file_->HashTile(slot, tile, data);
        return std::nullopt;
      },
      /*pump=*/true);
  if (bad) Fail(file_->MismatchError(*bad));
}

void SwapPipeline::Drain() {
  while (engine_->in_flight() > 0) {
    absl::StatusOr<std::vector<IoCompletion>> done = engine_->Reap(engine_->in_flight());
    if (!done.ok()) {  // a broken engine: nothing more will complete
      Fail(done.status());
      return;
    }
    for (const IoCompletion& c : *done) OnCompletion(c);
  }
}

absl::Status SwapPipeline::Run(const TileKernel* kernel, const OverlapFn& overlap,
                               const std::function<void(int64_t slot)>& after_update) {
  if (engine_->in_flight() != 0) {
    return absl::FailedPreconditionError(absl::StrCat("swap pipeline: ", engine_->in_flight(),
                                                      " requests of an earlier run are in flight"));
  }
  const SwapLayout& layout = file_->layout();
  bufs_.assign(buffers_->count(), Buffer{});
  next_read_ = 0;
  error_ = absl::OkStatus();
  StartReads();
  if (overlap) overlap([this] { Pump(); });
  for (int64_t k = 0; k < layout.nvme_sub_groups() && error_.ok(); ++k) {
    int b = BufferOf(k);
    while (error_.ok() && (b < 0 || bufs_[b].state != BufState::kReady)) {
      if (engine_->in_flight() == 0) {
        Fail(absl::InternalError(absl::StrCat("swap pipeline stalled before ",
                                              file_->DescribeSlot(k), ": nothing in flight")));
        break;
      }
      Absorb(engine_->Reap(1));
      StartReads();
      b = BufferOf(k);
    }
    if (!error_.ok()) break;
    Process(b, kernel);  // pumps the engine between tiles
    if (!error_.ok()) break;
    if (after_update) after_update(k);
    bufs_[b].state = BufState::kWriting;
    bufs_[b].submitted = std::chrono::steady_clock::now();
    const IoRequest write{IoOp::kWrite,        file_->fd(),         layout.slot_offset(k),
                          buffers_->buffer(b), layout.slot_bytes(), Tag(b, IoOp::kWrite)};
    absl::Status submitted = engine_->Submit({write});
    if (!submitted.ok()) {
      Fail(file_->IoError(k, IoOp::kWrite, submitted));
      break;
    }
    Pump();
  }
  Drain();
  bufs_.clear();
  return std::exchange(error_, absl::OkStatus());
}

absl::Status SwapPipeline::ReadSlot(int64_t slot, char* buf, bool verify) {
  if (!file_->written(slot)) {
    file_->ZeroPadding(slot, buf);
    ForTiles(
        slot,
        [&](int64_t tile) -> std::optional<ChecksumMismatch> {
          file_->ZeroTile(slot, tile, buf);
          return std::nullopt;
        },
        /*pump=*/false);
    return absl::OkStatus();
  }
  const SwapLayout& layout = file_->layout();
  const auto start = std::chrono::steady_clock::now();
  absl::Status read =
      ReadFully(*engine_, file_->fd(), layout.slot_offset(slot), buf, layout.slot_bytes());
  io_.Record(/*write=*/false, static_cast<int64_t>(layout.slot_bytes()),
             std::chrono::steady_clock::now() - start);
  if (!read.ok()) return file_->IoError(slot, IoOp::kRead, read);
  if (!verify || !file_->checksums()) return absl::OkStatus();
  std::optional<ChecksumMismatch> bad = ForTiles(
      slot, [&](int64_t tile) { return file_->VerifyTile(slot, tile, buf); }, /*pump=*/false);
  return bad ? file_->MismatchError(*bad) : absl::OkStatus();
}

absl::Status SwapPipeline::WriteSlot(int64_t slot, char* buf) {
  if (file_->checksums()) {
    ForTiles(
        slot,
        [&](int64_t tile) -> std::optional<ChecksumMismatch> {
          file_->HashTile(slot, tile, buf);
          return std::nullopt;
        },
        /*pump=*/false);
  }
  const SwapLayout& layout = file_->layout();
  const auto start = std::chrono::steady_clock::now();
  absl::Status written =
      WriteFully(*engine_, file_->fd(), layout.slot_offset(slot), buf, layout.slot_bytes());
  io_.Record(/*write=*/true, static_cast<int64_t>(layout.slot_bytes()),
             std::chrono::steady_clock::now() - start);
  file_->set_written(slot);
  if (!written.ok()) return file_->IoError(slot, IoOp::kWrite, written);
  return absl::OkStatus();
}

}  // namespace zo
