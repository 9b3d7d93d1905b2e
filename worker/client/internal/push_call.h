// One step's gradient pushes to one server, whichever route carries them
// (a PushGradients stream, or the in-process route): what FinishStep and
// the client's teardown need of it.
#ifndef ZO_WORKER_CLIENT_INTERNAL_PUSH_CALL_H_
#define ZO_WORKER_CLIENT_INTERNAL_PUSH_CALL_H_

#include <condition_variable>
#include <mutex>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace zo::client_internal {

// Told whenever one of the calls sharing it ends, so that one waiter can
// watch several calls at once (a step's calls to every server).
struct StreamEnds {
  std::mutex mu;
  std::condition_variable cv;
};

// Thread-safe.
class PushCall {
 public:
  virtual ~PushCall() = default;
  // No more pieces: the call ends once every piece is in.
  virtual void Close() = 0;
  // Ends the call now; pieces not yet in are dropped.
  virtual void Cancel() = 0;
  // Waits until the call has ended, at most `timeout` (zero: just looks);
  // true when it has. A call past its deadline ends here, failing.
  virtual bool WaitFor(absl::Duration timeout) = 0;
  // When WaitFor should look again for a call that cannot end by itself at
  // its deadline; InfiniteFuture for one that does.
  virtual absl::Time deadline() const { return absl::InfiniteFuture(); }
  // OK while the call is healthy; after a failure its error, naming the
  // server. After WaitFor returned true: the call's final status.
  virtual absl::Status status() const = 0;
};

}  // namespace zo::client_internal

#endif  // ZO_WORKER_CLIENT_INTERNAL_PUSH_CALL_H_
