#include "offload/io/block_io_engine.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <deque>
#include <limits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "offload/io/aligned_buffer_pool.h"
#include "offload/io/io_error.h"

namespace zo {
namespace {

// EINTR/EAGAIN from a backend are retried this often per piece, then reported.
constexpr int kMaxRetries = 8;

bool IsAligned(uint64_t value, size_t alignment) { return (value & (alignment - 1)) == 0; }

class BlockIoEngine final : public IoEngine {
 public:
  BlockIoEngine(const IoEngineOptions& options, std::unique_ptr<IoBackend> backend,
                std::string name)
      : options_(options), backend_(std::move(backend)), name_(std::move(name)) {}
  ~BlockIoEngine() override;

  std::string_view name() const override { return name_; }
  const IoEngineOptions& options() const override { return options_; }
  absl::Status RegisterFile(int fd, absl::string_view path) override;
  absl::Status UnregisterFile(int fd) override;
  absl::Status RegisterBuffers(const AlignedBufferPool& pool) override;
  absl::Status UnregisterBuffers() override;
  absl::Status Submit(absl::Span<const IoRequest> requests) override;
  absl::StatusOr<std::vector<IoCompletion>> Reap(size_t min_complete) override;
  size_t in_flight() const override { return requests_.size() + completed_.size(); }

 private:
  struct Request {
    IoRequest req;
    size_t queued = 0;  // bytes handed out as pieces, counted from the start
    int pieces = 0;     // pieces in flight or waiting to be resubmitted
    absl::Status status;
  };
  struct Piece {
    IoPiece io;
    int retries = 0;
  };

  std::string PathOf(int fd) const;
  std::string Describe(const IoRequest& req, const IoPiece& piece) const;
  absl::Status CheckRequest(const IoRequest& req, size_t i) const;
  void Pump();
  void OnResult(const IoPieceResult& result);
  void MaybeComplete(uint64_t index);
  absl::Status Drive(size_t min_results);

  const IoEngineOptions options_;
  const std::unique_ptr<IoBackend> backend_;
  const std::string name_;

  absl::flat_hash_map<int, std::string> files_;      // fd -> path, for errors
  absl::node_hash_map<uint64_t, Request> requests_;  // by request index; not yet complete
  std::deque<uint64_t> unqueued_;                    // requests with bytes not yet in a piece
  std::deque<Piece> resubmit_;                       // remainders of short transfers, retries
  absl::flat_hash_map<uint64_t, Piece> in_flight_;   // by piece id
  std::vector<IoCompletion> completed_;
  std::vector<IoPieceResult> results_;  // scratch, reused
  uint64_t next_request_index_ = 0;
  uint64_t next_piece_index_ = 0;
  absl::Status broken_;  // sticky: the backend failed as a whole
};

BlockIoEngine::~BlockIoEngine() {
  // The kernel may still write into the callers' buffers: wait for it.
  while (!in_flight_.empty()) {
    results_.clear();
    absl::Status status = backend_->Wait(1, &results_);
    if (!status.ok()) {
      ZO_LOG(ERROR) << name_ << ": cannot wait for " << in_flight_.size()
                    << " pieces at shutdown: " << status;
      break;
    }
    for (const IoPieceResult& r : results_) in_flight_.erase(r.id);
  }
}

std::string BlockIoEngine::PathOf(int fd) const {
  auto it = files_.find(fd);
  return it == files_.end() ? absl::StrCat("fd ", fd) : it->second;
}

std::string BlockIoEngine::Describe(const IoRequest& req, const IoPiece& piece) const {
  return absl::StrCat(IoOpName(piece.op), " of ", PathOf(piece.fd), " at offset ", piece.offset,
                      " (", piece.len, " bytes; request offset ", req.offset, ", length ", req.len,
                      ")");
}

absl::Status BlockIoEngine::CheckRequest(const IoRequest& req, size_t i) const {
  auto fail = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request #", i, " (", IoOpName(req.op), " of ", PathOf(req.fd), ", offset ", req.offset,
        ", length ", req.len, ", buffer ", absl::Hex(reinterpret_cast<uintptr_t>(req.buf)),
        ", tag ", req.tag, "): ", why));
  };
  if (!files_.contains(req.fd)) {
    return fail(absl::StrCat("fd ", req.fd, " is not registered with the engine"));
  }
  if (req.len == 0) return absl::OkStatus();
  if (req.buf == nullptr) return fail("null buffer");
  const size_t a = options_.alignment;
  if (!IsAligned(req.offset, a)) {
    return fail(absl::StrCat("offset is not a multiple of ", a, " (O_DIRECT alignment)"));
  }
  if (!IsAligned(req.len, a)) {
    return fail(absl::StrCat("length is not a multiple of ", a, " (O_DIRECT alignment)"));
  }
  if (!IsAligned(reinterpret_cast<uintptr_t>(req.buf), a)) {
    return fail(absl::StrCat("buffer address is not a multiple of ", a, " (O_DIRECT alignment)"));
  }
  constexpr uint64_t kMaxOffset = std::numeric_limits<int64_t>::max();
  if (req.offset > kMaxOffset || req.len > kMaxOffset - req.offset) {
    return fail("offset + length does not fit in off_t");
  }
  return absl::OkStatus();
}

absl::Status BlockIoEngine::RegisterFile(int fd, absl::string_view path) {
  if (fd < 0) return absl::InvalidArgumentError(absl::StrCat("RegisterFile: bad fd ", fd));
  if (auto it = files_.find(fd); it != files_.end()) {
    return absl::AlreadyExistsError(
        absl::StrCat("RegisterFile: fd ", fd, " is already registered as ", it->second));
  }
  ZO_RETURN_IF_ERROR(backend_->RegisterFile(fd));
  files_.emplace(fd, std::string(path));
  return absl::OkStatus();
}

absl::Status BlockIoEngine::UnregisterFile(int fd) {
  if (!files_.contains(fd)) {
    return absl::NotFoundError(absl::StrCat("UnregisterFile: fd ", fd, " is not registered"));
  }
  for (const auto& [index, r] : requests_) {
    if (r.req.fd == fd) {
      return absl::FailedPreconditionError(absl::StrCat("UnregisterFile: requests on ", PathOf(fd),
                                                        " are in flight; reap them first"));
    }
  }
  ZO_RETURN_IF_ERROR(backend_->UnregisterFile(fd));
  files_.erase(fd);
  return absl::OkStatus();
}

absl::Status BlockIoEngine::RegisterBuffers(const AlignedBufferPool& pool) {
  if (!requests_.empty()) {
    return absl::FailedPreconditionError(
        "RegisterBuffers: requests are in flight; reap them first");
  }
  backend_->UnregisterBuffers();
  absl::Status status = backend_->RegisterBuffers(pool.iovecs());
  if (!status.ok()) {
    ZO_LOG(WARNING) << name_ << ": cannot register " << pool.count() << " buffers of "
                    << pool.buffer_bytes() << " bytes (" << status
                    << "); using them as plain buffers";
  }
  return absl::OkStatus();
}

absl::Status BlockIoEngine::UnregisterBuffers() {
  if (!requests_.empty()) {
    return absl::FailedPreconditionError(
        "UnregisterBuffers: requests are in flight; reap them first");
  }
  backend_->UnregisterBuffers();
  return absl::OkStatus();
}

absl::Status BlockIoEngine::Submit(absl::Span<const IoRequest> requests) {
  ZO_RETURN_IF_ERROR(broken_);
  for (size_t i = 0; i < requests.size(); ++i) ZO_RETURN_IF_ERROR(CheckRequest(requests[i], i));
  for (const IoRequest& req : requests) {
    const uint64_t index = next_request_index_++;
    if (req.len == 0) {
      completed_.push_back({req.tag, absl::OkStatus()});
      continue;
    }
    Request r;
    r.req = req;
    requests_.emplace(index, std::move(r));
    unqueued_.push_back(index);
  }
  Pump();
  return absl::OkStatus();
}

void BlockIoEngine::Pump() {
  std::vector<IoPiece> batch;
  const size_t depth = static_cast<size_t>(options_.queue_depth);
  while (in_flight_.size() < depth) {
    Piece piece;
    if (!resubmit_.empty()) {
      piece = resubmit_.front();
      resubmit_.pop_front();
      Request& r = requests_.at(piece.io.request_index);
      if (!r.status.ok()) {  // another piece failed: the rest is pointless
        --r.pieces;
        MaybeComplete(piece.io.request_index);
        continue;
      }
    } else if (!unqueued_.empty()) {
      const uint64_t index = unqueued_.front();
      auto it = requests_.find(index);
      if (it == requests_.end() || !it->second.status.ok() ||
          it->second.queued == it->second.req.len) {
        unqueued_.pop_front();
        continue;
      }
      Request& r = it->second;
      const size_t n = std::min(options_.block_size, r.req.len - r.queued);
      piece.io.request_index = index;
      piece.io.op = r.req.op;
      piece.io.fd = r.req.fd;
      piece.io.offset = r.req.offset + r.queued;
      piece.io.buf = static_cast<char*>(r.req.buf) + r.queued;
      piece.io.len = n;
      r.queued += n;
      ++r.pieces;
      if (r.queued == r.req.len) unqueued_.pop_front();
    } else {
      break;
    }
    piece.io.id = piece.io.piece_index = next_piece_index_++;
    in_flight_.emplace(piece.io.id, piece);
    batch.push_back(piece.io);
  }
  if (!batch.empty()) backend_->Submit(batch);
}

void BlockIoEngine::OnResult(const IoPieceResult& result) {
  auto it = in_flight_.find(result.id);
  if (it == in_flight_.end()) {
    if (broken_.ok()) {
      broken_ =
          absl::InternalError(absl::StrCat(name_, ": backend completed unknown piece ", result.id));
    }
    return;
  }
  Piece piece = it->second;
  in_flight_.erase(it);
  const uint64_t index = piece.io.request_index;
  Request& r = requests_.at(index);
  const IoPiece& io = piece.io;
  absl::Status error;
  if (!r.status.ok()) {
    // Already failed; this piece only had to finish.
  } else if (result.result < 0) {
    const int err = static_cast<int>(-result.result);
    if ((err == EINTR || err == EAGAIN) && piece.retries < kMaxRetries) {
      ++piece.retries;
      resubmit_.push_front(piece);
      return;
    }
    error = ZO_ERRNO_STATUS(err, Describe(r.req, io));
  } else if (static_cast<uint64_t>(result.result) > io.len) {
    error = absl::InternalError(
        absl::StrCat(Describe(r.req, io), ": backend reported ", result.result, " bytes moved"));
  } else if (static_cast<size_t>(result.result) < io.len) {
    const size_t done = static_cast<size_t>(result.result);
    if (done > 0 && IsAligned(done, options_.alignment)) {
      // Kernels may move less than asked; the rest goes out again.
      piece.io.offset += done;
      piece.io.buf += done;
      piece.io.len -= done;
      piece.retries = 0;
      resubmit_.push_front(piece);
      return;
    }
    if (io.op == IoOp::kRead) {
      error = absl::DataLossError(absl::StrCat(
          Describe(r.req, io), ": short read of ", done, " bytes; the file ends at offset ",
          io.offset + done, ", before the requested end at ", r.req.offset + r.req.len));
    } else {
      error = absl::DataLossError(absl::StrCat(
          Describe(r.req, io), ": short write of ", done,
          " bytes that cannot be resubmitted (no progress or an unaligned remainder)"));
    }
  }
  if (!error.ok()) r.status = std::move(error);
  --r.pieces;
  MaybeComplete(index);
}

void BlockIoEngine::MaybeComplete(uint64_t index) {
  auto it = requests_.find(index);
  const Request& r = it->second;
  if (r.pieces > 0 || (r.status.ok() && r.queued < r.req.len)) return;
  completed_.push_back({r.req.tag, r.status});
  requests_.erase(it);
}

absl::Status BlockIoEngine::Drive(size_t min_results) {
  results_.clear();
  absl::Status status = backend_->Wait(min_results, &results_);
  if (!status.ok()) {
    broken_ = absl::Status(status.code(), absl::StrCat(name_, " engine broke: ", status.message()));
    return broken_;
  }
  for (const IoPieceResult& result : results_) OnResult(result);
  ZO_RETURN_IF_ERROR(broken_);
  Pump();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<IoCompletion>> BlockIoEngine::Reap(size_t min_complete) {
  ZO_RETURN_IF_ERROR(broken_);
  if (min_complete > in_flight()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Reap(", min_complete, ") waits for more than the ", in_flight(), " requests in flight"));
  }
  if (!in_flight_.empty()) ZO_RETURN_IF_ERROR(Drive(0));
  while (completed_.size() < min_complete) {
    if (in_flight_.empty()) {
      Pump();
      if (completed_.size() >= min_complete) break;
      if (in_flight_.empty()) {
        broken_ = absl::InternalError(absl::StrCat(name_, ": requests outstanding, no pieces"));
        return broken_;
      }
    }
    ZO_RETURN_IF_ERROR(Drive(1));
  }
  return std::exchange(completed_, {});
}

}  // namespace

absl::StatusOr<std::unique_ptr<IoEngine>> NewBlockIoEngine(const IoEngineOptions& options,
                                                           std::unique_ptr<IoBackend> backend,
                                                           std::string name) {
  ZO_RETURN_IF_ERROR(ValidateIoEngineOptions(options));
  if (backend == nullptr) return absl::InvalidArgumentError("NewBlockIoEngine: null backend");
  if (name.empty()) name = std::string(backend->name());
  return std::unique_ptr<IoEngine>(new BlockIoEngine(options, std::move(backend), std::move(name)));
}

}  // namespace zo
