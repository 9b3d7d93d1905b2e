// One step's gradient pushes to one server over the in-process route
// (rpc/in_process_route.h): each piece is handed to the server's
// accumulator from the caller's memory, on the caller's thread, with no
// copy and no thread of the call's own. A piece whose chunk is still
// updating the step before (a delayed update) is kept, its bytes copied
// unless an owner keeps them, and handed over again by the server's wake
// once the chunk is released, so Push never blocks on the server's update.
#ifndef ZO_WORKER_CLIENT_INTERNAL_LOCAL_PUSH_CALL_H_
#define ZO_WORKER_CLIENT_INTERNAL_LOCAL_PUSH_CALL_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/zo/v1/gradients.pb.h"
#include "rpc/in_process_route.h"
#include "worker/client/internal/byte_budget.h"
#include "worker/client/internal/push_call.h"

namespace zo::client_internal {

// Thread-safe. The bytes of a piece count against `budget` from Push until
// the server has it (or it is dropped).
class LocalPushCall final : public PushCall {
 public:
  // `budget` and `ends` (may be null) must outlive the call. Pieces still
  // kept at `deadline` fail the call with DEADLINE_EXCEEDED.
  LocalPushCall(std::shared_ptr<InProcessRoute> route, std::string server, int64_t step,
                absl::Time deadline, ByteBudget* budget, StreamEnds* ends = nullptr);
  // Cancels, then waits for the server's wakes already on their way.
  ~LocalPushCall() override;

  LocalPushCall(const LocalPushCall&) = delete;
  LocalPushCall& operator=(const LocalPushCall&) = delete;

  // Hands one piece (`header`: every field but data) to the server. The
  // call's error once it has failed; FAILED_PRECONDITION after Close.
  // `data` is read before Push returns unless `owner` (may be null) keeps
  // it valid and unchanged for as long as the call holds the owner. With
  // `lend` (and an owner) the server may read it in place until its update
  // of the step has (InProcessRoute::TryPush's `lent`).
  absl::Status Push(const v1::GradientPiece& header, absl::Span<const std::byte> data,
                    std::shared_ptr<const void> owner, bool lend = false);

  void Close() override;
  void Cancel() override;
  bool WaitFor(absl::Duration timeout) override;
  absl::Time deadline() const override { return deadline_; }
  absl::Status status() const override;

 private:
  struct Kept {
    v1::GradientPiece header;
    absl::Span<const std::byte> data;
    std::shared_ptr<const void> owner;  // keeps `data`: the caller's, or a copy
    bool lend = false;                  // the server may keep `owner`
    InProcessRoute::PushWait wait;
    // Push is still handing it over: its wake may run before Push knows it
    // waits, and then only says so.
    bool handing_over = true;
    bool woken_early = false;
    // Failed meanwhile: its wake could not be taken back; it drops the piece.
    bool abandoned = false;
  };

  std::function<void()> WakeFor(uint64_t id);
  // The server's wake for kept piece `id`: hands it over again.
  void Retry(uint64_t id);
  // Requires mu_: tries kept piece `id` again (it is not handing over).
  void RetryLocked(uint64_t id);
  // Requires mu_: forgets kept piece `id`, its bytes released.
  void DropLocked(std::map<uint64_t, Kept>::iterator it);
  // Requires mu_: the call fails with `status` (the first failure stays);
  // kept pieces are taken back, or left to their wakes to drop.
  void FailLocked(absl::Status status);
  // Requires mu_: ends the call once closed or failed and nothing is kept;
  // true when this ended it (the caller then calls Notify, unlocked).
  bool MaybeEndLocked();
  void Notify();

  const std::shared_ptr<InProcessRoute> route_;
  const std::string server_;
  const int64_t step_;
  const absl::Time deadline_;
  ByteBudget* const budget_;
  StreamEnds* const ends_;

  mutable std::mutex mu_;
  std::condition_variable done_cv_;
  std::map<uint64_t, Kept> kept_;  // guarded by mu_
  uint64_t next_id_ = 1;           // guarded by mu_
  bool closing_ = false;           // guarded by mu_
  bool done_ = false;              // guarded by mu_
  int wakes_running_ = 0;          // guarded by mu_
  absl::Status status_;            // guarded by mu_
};

}  // namespace zo::client_internal

#endif  // ZO_WORKER_CLIENT_INTERNAL_LOCAL_PUSH_CALL_H_
