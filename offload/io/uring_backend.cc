#include "offload/io/uring_backend.h"

#include <liburing.h>
#include <sys/resource.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "offload/io/io_error.h"

namespace zo {
namespace {

std::string MemlockLimitText() {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return "RLIMIT_MEMLOCK unknown";
  if (limit.rlim_cur == RLIM_INFINITY) return "RLIMIT_MEMLOCK unlimited";
  return absl::StrCat("RLIMIT_MEMLOCK ", limit.rlim_cur / 1024, " KiB");
}

absl::Status SetupError(int err, const char* file, int line) {
  std::string hint;
  switch (err) {
    case ENOSYS:
      hint = "the kernel has no io_uring, or seccomp blocks it";
      break;
    case EPERM:
      hint = "io_uring is disabled (sysctl kernel.io_uring_disabled) or the container forbids it";
      break;
    case ENOMEM:
      hint = absl::StrCat("kernels before 5.12 charge rings to the locked-memory limit; ",
                          MemlockLimitText());
      break;
    default:
      hint = "unexpected error";
  }
  return ErrnoToStatus(err, absl::StrCat("io_uring_queue_init (", hint, ")"), file, line);
}

class UringBackend final : public IoBackend {
 public:
  explicit UringBackend(bool single_submit) : single_submit_(single_submit) {}
  ~UringBackend() override {
    if (!ready_) return;
    if (!regions_.empty()) io_uring_unregister_buffers(&ring_);
    io_uring_queue_exit(&ring_);  // closing the ring drops the file table
  }

  // Sets up the ring in place (liburing's struct is not meant to move).
  absl::Status Init(const IoEngineOptions& options);

  std::string_view name() const override { return "io_uring"; }
  absl::Status RegisterFile(int fd) override;
  absl::Status UnregisterFile(int fd) override;
  absl::Status RegisterBuffers(absl::Span<const iovec> buffers) override;
  void UnregisterBuffers() override;
  void Submit(absl::Span<const IoPiece> pieces) override;
  absl::Status Wait(size_t min_results, std::vector<IoPieceResult>* out) override;

 private:
  struct Region {
    uintptr_t begin;
    uintptr_t end;
    int index;
  };

  int FindRegion(const char* buf, size_t len) const;
  void Flush();
  size_t Peek(std::vector<IoPieceResult>* out);

  const bool single_submit_;
  io_uring ring_{};
  bool ready_ = false;
  absl::flat_hash_map<int, int> slot_of_;  // fd -> fixed file slot
  std::vector<int> free_slots_;
  std::vector<Region> regions_;             // registered buffers, sorted by begin
  std::vector<IoPieceResult> not_started_;  // pieces that found no SQE
  size_t in_flight_ = 0;                    // SQEs handed to the ring, CQEs not yet seen
};

absl::Status UringBackend::RegisterFile(int fd) {
  if (free_slots_.empty()) return absl::OkStatus();  // table full or absent: plain fd
  const int slot = free_slots_.back();
  if (io_uring_register_files_update(&ring_, slot, &fd, 1) != 1) return absl::OkStatus();
  free_slots_.pop_back();
  slot_of_[fd] = slot;
  return absl::OkStatus();
}

absl::Status UringBackend::UnregisterFile(int fd) {
  auto it = slot_of_.find(fd);
  if (it == slot_of_.end()) return absl::OkStatus();
  int none = -1;
  const int ret = io_uring_register_files_update(&ring_, it->second, &none, 1);
  if (ret < 0) return ZO_ERRNO_STATUS(-ret, absl::StrCat("io_uring: releasing slot of fd ", fd));
  free_slots_.push_back(it->second);
  slot_of_.erase(it);
  return absl::OkStatus();
}

absl::Status UringBackend::RegisterBuffers(absl::Span<const iovec> buffers) {
  UnregisterBuffers();
  if (buffers.empty()) return absl::OkStatus();
  const int ret = io_uring_register_buffers(&ring_, buffers.data(), buffers.size());
  if (ret < 0) {
    size_t bytes = 0;
    for (const iovec& v : buffers) bytes += v.iov_len;
    return ZO_ERRNO_STATUS(
        -ret, absl::StrCat("io_uring_register_buffers (", buffers.size(), " buffers, ", bytes,
                           " bytes; ", MemlockLimitText(), ")"));
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    const auto begin = reinterpret_cast<uintptr_t>(buffers[i].iov_base);
    regions_.push_back({begin, begin + buffers[i].iov_len, static_cast<int>(i)});
  }
  std::sort(regions_.begin(), regions_.end(),
            [](const Region& a, const Region& b) { return a.begin < b.begin; });
  return absl::OkStatus();
}

void UringBackend::UnregisterBuffers() {
  if (regions_.empty()) return;
  io_uring_unregister_buffers(&ring_);
  regions_.clear();
}

int UringBackend::FindRegion(const char* buf, size_t len) const {
  const auto begin = reinterpret_cast<uintptr_t>(buf);
  auto it = std::upper_bound(regions_.begin(), regions_.end(), begin,
                             [](uintptr_t b, const Region& r) { return b < r.begin; });
  if (it == regions_.begin()) return -1;
  --it;
  return begin >= it->begin && begin + len <= it->end ? it->index : -1;
}

void UringBackend::Flush() {
  int ret;
  do {
    ret = io_uring_submit(&ring_);
  } while (ret == -EINTR);
  // Other errors leave the SQEs queued; Wait submits them again and reports
  // an error that persists.
}

void UringBackend::Submit(absl::Span<const IoPiece> pieces) {
  for (const IoPiece& p : pieces) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      Flush();
      sqe = io_uring_get_sqe(&ring_);
    }
    if (sqe == nullptr) {
      not_started_.push_back({p.id, -EBUSY});
      continue;
    }
    int fd = p.fd;
    unsigned flags = 0;
    if (auto it = slot_of_.find(p.fd); it != slot_of_.end()) {
      fd = it->second;
      flags |= IOSQE_FIXED_FILE;
    }
    const int index = FindRegion(p.buf, p.len);
    const auto len = static_cast<unsigned>(p.len);
    if (p.op == IoOp::kRead) {
      if (index >= 0) {
        io_uring_prep_read_fixed(sqe, fd, p.buf, len, p.offset, index);
      } else {
        io_uring_prep_read(sqe, fd, p.buf, len, p.offset);
      }
    } else {
      if (index >= 0) {
        io_uring_prep_write_fixed(sqe, fd, p.buf, len, p.offset, index);
      } else {
        io_uring_prep_write(sqe, fd, p.buf, len, p.offset);
      }
    }
    io_uring_sqe_set_flags(sqe, flags);
    io_uring_sqe_set_data64(sqe, p.id);
    ++in_flight_;
    if (single_submit_) Flush();
  }
  Flush();
}

size_t UringBackend::Peek(std::vector<IoPieceResult>* out) {
  constexpr unsigned kBatch = 64;
  io_uring_cqe* cqes[kBatch];
  size_t total = 0;
  while (unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, kBatch)) {
    for (unsigned i = 0; i < n; ++i) out->push_back({cqes[i]->user_data, cqes[i]->res});
    io_uring_cq_advance(&ring_, n);
    total += n;
  }
  in_flight_ -= total;
  return total;
}

absl::Status UringBackend::Wait(size_t min_results, std::vector<IoPieceResult>* out) {
  size_t got = not_started_.size();
  out->insert(out->end(), not_started_.begin(), not_started_.end());
  not_started_.clear();
  got += Peek(out);
  while (got < min_results) {
    if (in_flight_ == 0) {
      return absl::InternalError(absl::StrCat("io_uring: waiting for ", min_results - got,
                                              " results with nothing in flight"));
    }
    const unsigned want = static_cast<unsigned>(std::min(min_results - got, in_flight_));
    const int ret = io_uring_submit_and_wait(&ring_, want);
    if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
      return ZO_ERRNO_STATUS(-ret, "io_uring_submit_and_wait");
    }
    got += Peek(out);
  }
  return absl::OkStatus();
}

absl::Status UringBackend::Init(const IoEngineOptions& options) {
  io_uring_params params{};
  const unsigned entries = std::bit_ceil(static_cast<unsigned>(std::max(options.queue_depth, 1)));
  if (options.sqpoll) {
    params.flags |= IORING_SETUP_SQPOLL;
    params.sq_thread_idle = static_cast<unsigned>(options.sqpoll_idle_ms);
  }
  int ret = io_uring_queue_init_params(entries, &ring_, &params);
  if (ret < 0 && options.sqpoll) {
    ZO_LOG(WARNING) << "io_uring: SQPOLL refused (" << ErrnoName(-ret)
                    << "); using a ring without a polling thread";
    params = {};
    ret = io_uring_queue_init_params(entries, &ring_, &params);
  }
  if (ret < 0) return SetupError(-ret, __FILE__, __LINE__);
  ready_ = true;

  io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
  if (probe == nullptr) {
    return absl::UnimplementedError("io_uring: the kernel cannot list its opcodes (before 5.6)");
  }
  const std::pair<int, const char*> needed[] = {{IORING_OP_READ, "IORING_OP_READ"},
                                                {IORING_OP_WRITE, "IORING_OP_WRITE"},
                                                {IORING_OP_READ_FIXED, "IORING_OP_READ_FIXED"},
                                                {IORING_OP_WRITE_FIXED, "IORING_OP_WRITE_FIXED"}};
  for (const auto& [op, op_name] : needed) {
    if (!io_uring_opcode_supported(probe, op)) {
      io_uring_free_probe(probe);
      return absl::UnimplementedError(
          absl::StrCat("io_uring: the kernel lacks ", op_name, " (needs Linux 5.6)"));
    }
  }
  io_uring_free_probe(probe);

  // Sparse file table (Linux 5.19); without it plain fds still work.
  if (options.max_files > 0 &&
      io_uring_register_files_sparse(&ring_, static_cast<unsigned>(options.max_files)) == 0) {
    for (int slot = options.max_files - 1; slot >= 0; --slot) free_slots_.push_back(slot);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<IoBackend>> CreateUringBackend(const IoEngineOptions& options) {
  auto backend = std::make_unique<UringBackend>(options.single_submit);
  absl::Status status = backend->Init(options);
  if (!status.ok()) return status;
  return std::unique_ptr<IoBackend>(std::move(backend));
}

absl::Status ProbeIoUring() { return CreateUringBackend(IoEngineOptions{}).status(); }

}  // namespace zo
