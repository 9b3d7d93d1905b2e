#include "offload/io/pread_backend.h"

#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

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
// under mu_. std::mutex rather than absl::Mutex: Debian's Abseil is not built
// for ThreadSanitizer, which then cannot see absl::Mutex and reports every
// access to these queues as a race.
class PreadBackend final : public IoBackend {
 public:
  explicit PreadBackend(int threads) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Run(); });
  }
  ~PreadBackend() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  std::string_view name() const override { return "pread"; }

  void Submit(absl::Span<const IoPiece> pieces) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.insert(queue_.end(), pieces.begin(), pieces.end());
    }
    work_cv_.notify_all();
  }

  absl::Status Wait(size_t min_results, std::vector<IoPieceResult>* out) override {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return results_.size() >= min_results; });
    out->insert(out->end(), results_.begin(), results_.end());
    results_.clear();
    return absl::OkStatus();
  }

 private:
  void Run() {
    for (;;) {
      IoPiece piece;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        piece = queue_.front();
        queue_.pop_front();
      }
      const int64_t result = Transfer(piece);
      {
        std::lock_guard<std::mutex> lock(mu_);
        results_.push_back({piece.id, result});
      }
      done_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_cv_;     // queue_ gained pieces, or stop_
  std::condition_variable done_cv_;     // results_ grew
  std::deque<IoPiece> queue_;           // guarded by mu_
  std::vector<IoPieceResult> results_;  // guarded by mu_
  bool stop_ = false;                   // guarded by mu_
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoBackend> CreatePreadBackend(int threads) {
  return std::make_unique<PreadBackend>(threads < 1 ? 1 : threads);
}

}  // namespace zo
