// Wraps any backend and breaks chosen pieces on purpose, deterministically:
// errors (EIO, ENOSPC, ...), short transfers the engine must resubmit, and
// completions held back or shuffled. Faults sit below the engine, so the
// splitting, resubmission and error wording under test are the real ones.
//
//   FaultPlan plan;
//   plan.faults.push_back(IoFault::FailRequest(3, EIO));          // the 4th request
//   plan.faults.push_back(IoFault::FailRange(1 << 20, 2 << 20, ENOSPC, IoOp::kWrite));
//   plan.faults.push_back(IoFault::ShortPiece(0));                // half of the 1st piece
//   ZO_ASSIGN_OR_RETURN(auto engine,
//       CreateFaultInjectingEngine(options, CreatePreadBackend(4), std::move(plan)));
#ifndef ZO_OFFLOAD_IO_FAULT_INJECTING_BACKEND_H_
#define ZO_OFFLOAD_IO_FAULT_INJECTING_BACKEND_H_

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "offload/io/io_backend.h"
#include "offload/io/io_engine.h"

namespace zo {

// Which pieces a fault hits (every condition set must hold) and what it does.
struct IoFault {
  enum class Action {
    kFail,   // completes with -error; nothing moves
    kShort,  // only short_bytes move; the engine must send the rest again
    kDelay,  // the result comes back after `delay` later results
    kSlow,   // the result comes back no sooner than `latency` after submission
  };
  Action action = Action::kFail;
  int error = EIO;         // kFail
  size_t short_bytes = 0;  // kShort; 0: half the piece in whole 4 KiB blocks
  int delay = 1;           // kDelay
  absl::Duration latency;  // kSlow

  std::optional<IoOp> op;
  std::optional<int> fd;
  std::optional<uint64_t> request_index;  // the engine's Nth accepted request, from 0
  std::optional<uint64_t> piece_index;    // the engine's Nth started piece, from 0
  uint64_t offset_begin = 0;              // the piece overlaps [offset_begin, offset_end)
  uint64_t offset_end = std::numeric_limits<uint64_t>::max();
  double probability = 1.0;  // drawn from the plan's seeded generator
  int64_t times = -1;        // fires at most this often; -1: no limit

  static IoFault FailRequest(uint64_t request_index, int error = EIO);
  static IoFault FailRange(uint64_t begin, uint64_t end, int error = EIO,
                           std::optional<IoOp> op = std::nullopt);
  static IoFault FailRandomly(double probability, int error = EIO);
  static IoFault ShortPiece(uint64_t piece_index, size_t short_bytes = 0);
  static IoFault DelayPiece(uint64_t piece_index, int delay);
  // Every piece (of `op`, when given) takes at least `latency`: a slow or
  // overloaded disk. The data is intact.
  static IoFault Slow(absl::Duration latency, std::optional<IoOp> op = std::nullopt);
};

struct FaultPlan {
  std::vector<IoFault> faults;  // the first that matches a piece applies
  uint64_t seed = 1;
  bool reorder = false;  // shuffle every batch of results (seeded)
};

// Thread-compatible, like every backend.
class FaultInjectingBackend final : public IoBackend {
 public:
  FaultInjectingBackend(std::unique_ptr<IoBackend> inner, FaultPlan plan);

  std::string_view name() const override { return name_; }
  absl::Status RegisterFile(int fd) override { return inner_->RegisterFile(fd); }
  absl::Status UnregisterFile(int fd) override { return inner_->UnregisterFile(fd); }
  absl::Status RegisterBuffers(absl::Span<const iovec> buffers) override {
    return inner_->RegisterBuffers(buffers);
  }
  void UnregisterBuffers() override { inner_->UnregisterBuffers(); }
  void Submit(absl::Span<const IoPiece> pieces) override;
  absl::Status Wait(size_t min_results, std::vector<IoPieceResult>* out) override;

  // Faults fired so far.
  int64_t injected() const { return injected_; }

 private:
  struct Held {
    IoPieceResult result;
    int remaining;  // later results to let pass first
  };

  struct Slowed {
    IoPieceResult result;
    absl::Time due;
  };

  const IoFault* Match(const IoPiece& piece);
  uint64_t NextRandom();
  // Holds a delayed or slowed result back, or passes it on.
  void Deliver(const IoPieceResult& result, std::vector<IoPieceResult>* out);
  // `result` to `out`, and the delayed results it was the last to wait for.
  void Pass(const IoPieceResult& result, std::vector<IoPieceResult>* out);
  // Passes the slowed results that are due.
  void PassDue(std::vector<IoPieceResult>* out);

  const std::unique_ptr<IoBackend> inner_;
  const FaultPlan plan_;
  const std::string name_;
  std::vector<int64_t> fired_;  // per fault
  uint64_t rng_state_;
  int64_t injected_ = 0;
  size_t inner_in_flight_ = 0;
  std::vector<IoPieceResult> ready_;                 // failed without reaching inner_
  std::vector<std::pair<uint64_t, int>> delay_ids_;  // piece id -> delay
  std::vector<Held> held_;
  std::vector<std::pair<uint64_t, absl::Time>> slow_ids_;  // piece id -> due
  std::vector<Slowed> slowed_;
};

// An engine over FaultInjectingBackend(inner, plan), named "faulty(<inner>)".
// `backend`, if given, receives a pointer to the wrapper (owned by the
// engine) to read injected().
absl::StatusOr<std::unique_ptr<IoEngine>> CreateFaultInjectingEngine(
    const IoEngineOptions& options, std::unique_ptr<IoBackend> inner, FaultPlan plan,
    FaultInjectingBackend** backend = nullptr);

}  // namespace zo

#endif  // ZO_OFFLOAD_IO_FAULT_INJECTING_BACKEND_H_
