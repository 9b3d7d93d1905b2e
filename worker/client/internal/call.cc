#include "worker/client/internal/call.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rpc/error_detail.h"

namespace zo::client_internal {

bool IsRetryable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded;
}

absl::Status ServerError(absl::string_view server, const absl::Status& status) {
  return FromServer(server, status);
}

bool CallGroup::Register(grpc::ClientContext* context) {
  std::lock_guard lock(mu_);
  if (cancelled_) return false;
  contexts_.insert(context);
  return true;
}

void CallGroup::Unregister(grpc::ClientContext* context) {
  std::lock_guard lock(mu_);
  contexts_.erase(context);
}

bool CallGroup::AddChild(CallGroup* child) {
  std::lock_guard lock(mu_);
  if (cancelled_) return false;
  children_.insert(child);
  return true;
}

void CallGroup::RemoveChild(CallGroup* child) {
  std::lock_guard lock(mu_);
  children_.erase(child);
}

bool CallGroup::AddHook(const void* key, std::function<void()> on_cancel) {
  std::lock_guard lock(mu_);
  if (cancelled_) return false;
  hooks_[key] = std::move(on_cancel);
  return true;
}

void CallGroup::RemoveHook(const void* key) {
  std::lock_guard lock(mu_);
  hooks_.erase(key);
}

void CallGroup::CancelAll() {
  {
    std::lock_guard lock(mu_);
    cancelled_ = true;
    // TryCancel only marks the call; it never waits on it, so holding mu_
    // here cannot deadlock with a call that is finishing. A child never
    // takes its parent's mutex, so locking the children's under it cannot
    // either.
    for (grpc::ClientContext* context : contexts_) context->TryCancel();
    for (CallGroup* child : children_) child->CancelAll();
    for (auto& [key, hook] : hooks_) hook();
    hooks_.clear();
  }
  cancelled_cv_.notify_all();
}

bool CallGroup::cancelled() const {
  std::lock_guard lock(mu_);
  return cancelled_;
}

bool CallGroup::Sleep(absl::Duration d) {
  std::unique_lock lock(mu_);
  return !cancelled_cv_.wait_for(lock, absl::ToChronoNanoseconds(d), [&] { return cancelled_; });
}

absl::Status RetryCall(const CallSettings& settings, absl::string_view server, CallGroup* group,
                       absl::FunctionRef<absl::Status(grpc::ClientContext&)> attempt) {
  const absl::Time start = settings.now();
  // The window opens at the first failure, not at the call: a pull that
  // waited minutes for its version and then lost its connection is retried
  // like one that failed at once.
  absl::Time give_up = absl::InfiniteFuture();
  absl::Duration backoff = settings.first_backoff;
  for (int attempts = 1;; ++attempts) {
    std::unique_ptr<grpc::ClientContext> context = NewCallContext(settings.attempt);
    if (group != nullptr && !group->Register(context.get())) {
      return ServerError(server, absl::CancelledError("call cancelled"));
    }
    absl::Status status = attempt(*context);
    if (group != nullptr) group->Unregister(context.get());
    if (status.ok()) return status;

    if (attempts == 1) give_up = settings.now() + settings.retry_for;
    const bool cancelled = group != nullptr && group->cancelled();
    if (cancelled || !IsRetryable(status.code()) || settings.now() + backoff > give_up) {
      absl::Status error = ServerError(server, status);
      if (attempts > 1) {
        error = WithMessage(
            error, absl::StrCat(error.message(), " (gave up after ", attempts, " attempts in ",
                                absl::FormatDuration(
                                    absl::Trunc(settings.now() - start, absl::Milliseconds(1))),
                                ")"));
      }
      return error;
    }
    if (group != nullptr) {
      if (!group->Sleep(backoff)) {
        return ServerError(server, absl::CancelledError("call cancelled"));
      }
    } else {
      absl::SleepFor(backoff);
    }
    backoff = std::min(backoff * 2, settings.max_backoff);
  }
}

absl::Status RunInParallel(size_t n, CallGroup& group, absl::FunctionRef<absl::Status(size_t)> fn) {
  std::mutex mu;
  absl::Status first_error;  // guarded by mu
  auto run = [&](size_t i) {
    absl::Status status = fn(i);
    if (status.ok()) return;
    std::lock_guard lock(mu);
    if (first_error.ok()) {
      first_error = std::move(status);
      group.CancelAll();
    }
  };
  std::vector<std::thread> threads;
  for (size_t i = 1; i < n; ++i) threads.emplace_back(run, i);
  if (n > 0) run(0);
  for (std::thread& t : threads) t.join();
  return first_error;
}

}  // namespace zo::client_internal
