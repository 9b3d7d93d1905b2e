#include "worker/client/internal/local_push_call.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/client/internal/call.h"

namespace zo::client_internal {

LocalPushCall::LocalPushCall(std::shared_ptr<InProcessRoute> route, std::string server,
                             int64_t step, absl::Time deadline, ByteBudget* budget,
                             StreamEnds* ends)
    : route_(std::move(route)),
      server_(std::move(server)),
      step_(step),
      deadline_(deadline),
      budget_(budget),
      ends_(ends) {}

LocalPushCall::~LocalPushCall() {
  std::unique_lock lock(mu_);
  if (!done_) {
    FailLocked(absl::CancelledError("the push was cancelled"));
    closing_ = true;
    MaybeEndLocked();
  }
  // Wakes the server had already queued still run; they drop their pieces.
  // And a wake that is still running (after it let go of mu_) is waited
  // for: it may not touch this object once it is gone.
  done_cv_.wait(lock, [&] { return kept_.empty() && wakes_running_ == 0; });
}

std::function<void()> LocalPushCall::WakeFor(uint64_t id) {
  return [this, id] { Retry(id); };
}

absl::Status LocalPushCall::Push(const v1::GradientPiece& header, absl::Span<const std::byte> data,
                                 std::shared_ptr<const void> owner, bool lend) {
  const auto bytes = static_cast<int64_t>(data.size());
  budget_->Acquire(step_, bytes);
  uint64_t id = 0;
  {
    std::lock_guard lock(mu_);
    if (!status_.ok() || closing_) {
      budget_->Release(step_, bytes);
      if (!status_.ok()) return status_;
      return absl::FailedPreconditionError(
          absl::StrCat("step ", step_, " is being finished; push its gradients before FinishStep"));
    }
    id = next_id_++;
    lend = lend && owner != nullptr;
    kept_.emplace(id,
                  Kept{.header = header, .data = data, .owner = owner, .lend = lend, .wait = {}});
  }
  // Unlocked: the server converts or copies the piece here, and pushes of
  // other threads to the same server go on meanwhile.
  InProcessRoute::PushWait wait;
  absl::StatusOr<InProcessRoute::PushOutcome> outcome =
      route_->TryPush(header, data, &wait, WakeFor(id), lend ? owner : nullptr);

  bool ended = false;
  absl::Status result;
  {
    std::lock_guard lock(mu_);
    auto it = kept_.find(id);
    if (!outcome.ok()) {
      DropLocked(it);
      FailLocked(ServerError(server_, outcome.status()));
    } else if (*outcome == InProcessRoute::PushOutcome::kAdded) {
      DropLocked(it);
    } else {
      Kept& k = it->second;
      k.wait = wait;
      k.handing_over = false;
      if (k.owner == nullptr) {
        // The caller's bytes are only lent until Push returns.
        auto copy = std::make_shared<std::vector<std::byte>>(data.begin(), data.end());
        k.data = {copy->data(), copy->size()};
        k.owner = std::move(copy);
      }
      if (!status_.ok()) {
        // Failed while this piece was handed over: take it back.
        if (route_->CancelPushWait(k.header, k.wait)) {
          DropLocked(it);
        } else {
          k.abandoned = true;
        }
      } else if (k.woken_early) {
        k.woken_early = false;
        RetryLocked(id);
      }
    }
    result = status_;
    ended = MaybeEndLocked();
  }
  if (ended) Notify();
  return result;
}

void LocalPushCall::Retry(uint64_t id) {
  // The wake holds no reference to this object: it counts itself in
  // wakes_running_ (the destructor waits for it) while it needs the object,
  // which lives while the piece is kept.
  bool ended = false;
  {
    std::lock_guard lock(mu_);
    ++wakes_running_;
    auto it = kept_.find(id);
    if (it != kept_.end() && it->second.handing_over) {
      it->second.woken_early = true;
    } else if (it != kept_.end()) {
      RetryLocked(id);
      ended = MaybeEndLocked();
    }
  }
  if (ended) Notify();
  std::lock_guard lock(mu_);
  if (--wakes_running_ == 0) done_cv_.notify_all();
}

void LocalPushCall::RetryLocked(uint64_t id) {
  auto it = kept_.find(id);
  Kept& k = it->second;
  if (k.abandoned || !status_.ok()) {
    DropLocked(it);
    return;
  }
  // Under mu_: a kept piece is the rare case (its chunk was busy), and
  // the wake runs on a server thread that holds none of the server's locks.
  absl::StatusOr<InProcessRoute::PushOutcome> outcome =
      route_->TryPush(k.header, k.data, &k.wait, WakeFor(id), k.lend ? k.owner : nullptr);
  if (!outcome.ok()) {
    DropLocked(it);
    FailLocked(ServerError(server_, outcome.status()));
  } else if (*outcome == InProcessRoute::PushOutcome::kAdded) {
    DropLocked(it);
  }
}

void LocalPushCall::DropLocked(std::map<uint64_t, Kept>::iterator it) {
  budget_->Release(step_, static_cast<int64_t>(it->second.data.size()));
  kept_.erase(it);
  if (kept_.empty()) done_cv_.notify_all();
}

void LocalPushCall::FailLocked(absl::Status status) {
  if (!status_.ok()) return;
  status_ = std::move(status);
  for (auto it = kept_.begin(); it != kept_.end();) {
    Kept& k = (it++)->second;
    // One being handed over is taken back by its Push.
    if (k.handing_over || k.abandoned) continue;
    if (route_->CancelPushWait(k.header, k.wait)) {
      DropLocked(std::prev(it));
    } else {
      k.abandoned = true;
    }
  }
}

bool LocalPushCall::MaybeEndLocked() {
  if (done_ || !kept_.empty() || (!closing_ && status_.ok())) return false;
  done_ = true;
  done_cv_.notify_all();
  return true;
}

void LocalPushCall::Notify() {
  if (ends_ == nullptr) return;
  // Taken and let go so that a waiter between checking its calls and
  // waiting cannot miss this.
  { std::lock_guard lock(ends_->mu); }
  ends_->cv.notify_all();
}

void LocalPushCall::Close() {
  bool ended = false;
  {
    std::lock_guard lock(mu_);
    closing_ = true;
    ended = MaybeEndLocked();
  }
  if (ended) Notify();
}

void LocalPushCall::Cancel() {
  bool ended = false;
  {
    std::lock_guard lock(mu_);
    FailLocked(ServerError(server_, absl::CancelledError("the push was cancelled")));
    closing_ = true;
    ended = MaybeEndLocked();
  }
  if (ended) Notify();
}

bool LocalPushCall::WaitFor(absl::Duration timeout) {
  bool ended = false;
  bool done = false;
  {
    std::unique_lock lock(mu_);
    const absl::Time until = std::min(deadline_, absl::Now() + timeout);
    if (until == absl::InfiniteFuture()) {
      done_cv_.wait(lock, [&] { return done_; });
    } else {
      done_cv_.wait_until(lock, absl::ToChronoTime(until), [&] { return done_; });
    }
    if (!done_ && absl::Now() >= deadline_) {
      FailLocked(
          ServerError(server_, absl::DeadlineExceededError(absl::StrCat(
                                   "the push of step ", step_, " still had ", kept_.size(),
                                   " piece(s) waiting for their chunk's update at its deadline"))));
      closing_ = true;
      ended = MaybeEndLocked();
      // Wakes already queued drop what they carry; they run soon.
      done_cv_.wait(lock, [&] { return done_ || kept_.empty(); });
      if (!done_) ended = MaybeEndLocked();
    }
    done = done_;
  }
  if (ended) Notify();
  return done;
}

absl::Status LocalPushCall::status() const {
  std::lock_guard lock(mu_);
  return status_;
}

}  // namespace zo::client_internal
