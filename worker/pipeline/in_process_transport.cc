#include "worker/pipeline/in_process_transport.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace zo::pipeline {

class InProcessFabric::StageTransport final : public Transport {
 public:
  StageTransport(InProcessFabric* fabric, int stage) : fabric_(fabric), stage_(stage) {}

  absl::Status Send(int to, const MessageTag& tag, const backend::Tensor& tensor) override {
    return fabric_->Send(stage_, to, tag, tensor);
  }
  absl::StatusOr<backend::Tensor> Recv(int from, const MessageTag& tag) override {
    return fabric_->Recv(from, stage_, tag);
  }

 private:
  InProcessFabric* const fabric_;
  const int stage_;
};

InProcessFabric::InProcessFabric(int stages, absl::Duration recv_timeout)
    : stages_(stages), recv_timeout_(recv_timeout), mailboxes_(stages > 0 ? stages * stages : 0) {
  for (int s = 0; s < stages; ++s) transports_.push_back(std::make_unique<StageTransport>(this, s));
}

InProcessFabric::~InProcessFabric() = default;

Transport& InProcessFabric::ForStage(int stage) { return *transports_.at(stage); }

void InProcessFabric::Abort(absl::Status why) {
  if (why.ok()) why = absl::AbortedError("the in-process pipeline was aborted");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.ok()) aborted_ = std::move(why);
  }
  changed_.notify_all();
}

absl::Status InProcessFabric::CheckStage(int stage, const char* role) const {
  if (stage < 0 || stage >= stages_) {
    return absl::InvalidArgumentError(
        absl::StrCat(role, " stage ", stage, " out of range [0, ", stages_, ")"));
  }
  return absl::OkStatus();
}

absl::Status InProcessFabric::Send(int from, int to, const MessageTag& tag,
                                   const backend::Tensor& tensor) {
  if (absl::Status s = CheckStage(to, "receiving"); !s.ok()) return s;
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("send of an undefined tensor as ", ToString(tag)));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_.ok()) return aborted_;
    mailboxes_[from * stages_ + to].push_back(Message{tag, tensor});
  }
  changed_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<backend::Tensor> InProcessFabric::Recv(int from, int to, const MessageTag& tag) {
  if (absl::Status s = CheckStage(from, "sending"); !s.ok()) return s;
  std::deque<Message>& mailbox = mailboxes_[from * stages_ + to];
  const auto deadline = std::chrono::steady_clock::now() +
                        absl::ToChronoNanoseconds(std::min(recv_timeout_, absl::Hours(24 * 365)));
  std::unique_lock<std::mutex> lock(mu_);
  if (recv_waits_ && aborted_.ok() && mailbox.empty()) recv_waits_();
  const bool ready =
      changed_.wait_until(lock, deadline, [&] { return !aborted_.ok() || !mailbox.empty(); });
  if (!aborted_.ok()) return aborted_;
  if (!ready) {
    return absl::DeadlineExceededError(absl::StrCat("no message from stage ", from, " within ",
                                                    absl::FormatDuration(recv_timeout_),
                                                    " (expected ", ToString(tag), ")"));
  }
  if (!(mailbox.front().tag == tag)) {
    return absl::FailedPreconditionError(absl::StrCat("expected ", ToString(tag), " from stage ",
                                                      from, " but received ",
                                                      ToString(mailbox.front().tag)));
  }
  backend::Tensor tensor = std::move(mailbox.front().tensor);
  mailbox.pop_front();
  return tensor;
}

}  // namespace zo::pipeline
