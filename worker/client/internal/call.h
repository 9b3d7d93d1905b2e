// How the client makes every call: a fresh context with a deadline and the
// token (rpc/call_context.h), retries of the transient codes with exponential backoff, errors that
// name the server, and cancellation of a group of calls (a Pull stops asking
// the other servers once one has failed).
#ifndef ZO_WORKER_CLIENT_INTERNAL_CALL_H_
#define ZO_WORKER_CLIENT_INTERNAL_CALL_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "rpc/call_context.h"

namespace zo::client_internal {

struct CallSettings {
  // Deadline and token of each attempt.
  CallOptions attempt = {.timeout = absl::Seconds(120)};
  // UNAVAILABLE and DEADLINE_EXCEEDED are retried for at most this long
  // after the first failure.
  absl::Duration retry_for = absl::Seconds(10);
  absl::Duration first_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  // The clock the retry window is measured on (a test's own clock lets it
  // pass time without waiting).
  absl::Time (*now)() = &absl::Now;
};

// The codes worth calling again: the server was unreachable or too slow.
bool IsRetryable(absl::StatusCode code);

// `status` with the same code and "server <name>: " before its message.
absl::Status ServerError(absl::string_view server, const absl::Status& status);

// Calls that can be cancelled together. Thread-safe.
class CallGroup {
 public:
  // Adds a call's context; false when the group is already cancelled (the
  // call should not start). The context must stay alive until Unregister.
  bool Register(grpc::ClientContext* context);
  void Unregister(grpc::ClientContext* context);
  // Makes `child` cancelled with this group (a caller's cancellation over
  // one operation's group); false, leaving it alone, when this group is
  // already cancelled. `child` must stay alive until RemoveChild.
  bool AddChild(CallGroup* child);
  void RemoveChild(CallGroup* child);
  // Runs `on_cancel` when the group is cancelled (a wait of the in-process
  // route, which has no context to cancel); false, keeping nothing, when it
  // already is. It runs under the group's lock, so it must not call into
  // the group. Kept under `key` until RemoveHook.
  bool AddHook(const void* key, std::function<void()> on_cancel);
  void RemoveHook(const void* key);
  // Cancels every registered call and child, and every later Register,
  // AddChild and Sleep.
  void CancelAll();
  bool cancelled() const;
  // Sleeps for `d`; false, early, when the group is cancelled.
  bool Sleep(absl::Duration d);

 private:
  mutable std::mutex mu_;
  std::condition_variable cancelled_cv_;
  bool cancelled_ = false;                              // guarded by mu_
  std::set<grpc::ClientContext*> contexts_;             // guarded by mu_
  std::set<CallGroup*> children_;                       // guarded by mu_
  std::map<const void*, std::function<void()>> hooks_;  // guarded by mu_
};

// Runs `attempt` with a fresh context (NewCallContext(settings.attempt)) until it returns OK, a
// code that is not retryable, or settings.retry_for has passed since the
// first failure (however long that attempt took), sleeping
// first_backoff, doubling to max_backoff, between attempts. The error keeps
// the last attempt's code and message, prefixed by ServerError(server, ...)
// and followed by the number of attempts when there was more than one.
// `group` (may be null) cancels the calls and the waits between them.
absl::Status RetryCall(const CallSettings& settings, absl::string_view server, CallGroup* group,
                       absl::FunctionRef<absl::Status(grpc::ClientContext&)> attempt);

// Runs fn(i) for every i in [0, n), fn(0) on the calling thread and the
// others on threads of their own (one per server: calls to different servers
// overlap). The first fn to fail cancels `group`, which fn's calls should
// use; its error is returned, not the cancellations it caused.
absl::Status RunInParallel(size_t n, CallGroup& group, absl::FunctionRef<absl::Status(size_t)> fn);

// Runs `done` (may be null) once: when the last of the parts it expects
// arrives, or when it is destroyed, whichever comes first, so that a caller
// waiting for `done` is not left waiting by a path that returned early (a
// pull's parts, each registered with its server). Arrive is thread-safe.
class OnceAllArrived {
 public:
  explicit OnceAllArrived(std::function<void()> done) : done_(std::move(done)) {}
  ~OnceAllArrived() { Fire(); }
  OnceAllArrived(const OnceAllArrived&) = delete;
  OnceAllArrived& operator=(const OnceAllArrived&) = delete;

  // Before any Arrive: the number of parts; 0 fires now.
  void Expect(size_t parts) {
    left_ = parts;
    if (parts == 0) Fire();
  }
  void Arrive() {
    if (left_.fetch_sub(1) == 1) Fire();
  }
  // Arrive as a callable for a part, or null when there is no `done`.
  std::function<void()> ArriveFn() {
    return done_ ? std::function<void()>([this] { Arrive(); }) : nullptr;
  }

 private:
  void Fire() {
    if (done_) std::call_once(once_, done_);
  }
  std::function<void()> done_;
  std::atomic<size_t> left_{0};
  std::once_flag once_;
};

}  // namespace zo::client_internal

#endif  // ZO_WORKER_CLIENT_INTERNAL_CALL_H_
