#include "offload/io/pread_backend.h"

#include <unistd.h>

#include <cerrno>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace zo {
namespace {

// One system call per piece: a short count goes back to the engine as is,
// exactly as io_uring would report it.
int64_t Transfer(const IoPiece& p) {
  for (;;) {
    const ssize_t n = p.op == IoOp::kRead
                          ? pread(p.fd, p.buf, p.len, static_cast<off_t>(p.offset))
                          : pwrite(p.fd, p.buf, p.len, static_cast<off_t>(p.offset));
    if (n >= 0) return n;
    if (errno != EINTR) return -errno;
  }
}

// Thread-compatible from the engine's side; the workers share the queues
// under mu_.
class PreadBackend final : public IoBackend {
 public:
  explicit PreadBackend(int threads) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Run(); });
  }
  ~PreadBackend() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread& t : workers_) t.join();
  }

  std::string_view name() const override { return "pread"; }

  void Submit(absl::Span<const IoPiece> pieces) override {
    absl::MutexLock lock(&mu_);
    queue_.insert(queue_.end(), pieces.begin(), pieces.end());
  }

  absl::Status Wait(size_t min_results, std::vector<IoPieceResult>* out) override {
    struct Enough {
      const PreadBackend* self;
      size_t min;
      bool operator()() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return self->results_.size() >= min;
      }
    } enough{this, min_results};
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&enough));
    out->insert(out->end(), results_.begin(), results_.end());
    results_.clear();
    return absl::OkStatus();
  }

 private:
  bool HasWorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); }

  void Run() {
    for (;;) {
      IoPiece piece;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &PreadBackend::HasWorkOrStop));
        if (queue_.empty()) return;  // stopping, nothing left
        piece = queue_.front();
        queue_.pop_front();
      }
      const int64_t result = Transfer(piece);
      absl::MutexLock lock(&mu_);
      results_.push_back({piece.id, result});
    }
  }

  absl::Mutex mu_;
  std::deque<IoPiece> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<IoPieceResult> results_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoBackend> CreatePreadBackend(int threads) {
  return std::make_unique<PreadBackend>(threads < 1 ? 1 : threads);
}

}  // namespace zo
