// A transport between pipeline stages that run as threads of one process
// (tests, and a single-host pipeline without NCCL).
//
//   InProcessFabric fabric(stages);
//   // thread s:
//   Executor executor(s, stages, chunks, programs[s], module[s], fabric.ForStage(s));
//   if (!executor.RunStep(step).ok()) fabric.Abort(status);  // frees the others
#ifndef ZO_WORKER_PIPELINE_IN_PROCESS_TRANSPORT_H_
#define ZO_WORKER_PIPELINE_IN_PROCESS_TRANSPORT_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/pipeline/transport.h"

namespace zo::pipeline {

// One FIFO mailbox per directed (sender, receiver) pair. Send hands over the
// tensor handle (no copy), so the sender must not modify the tensor after
// sending it. Thread-safe: each stage's transport is used by its own thread,
// Abort from any thread. The fabric must outlive the transports it hands out.
class InProcessFabric {
 public:
  explicit InProcessFabric(int stages, absl::Duration recv_timeout = absl::Minutes(10));
  ~InProcessFabric();

  InProcessFabric(const InProcessFabric&) = delete;
  InProcessFabric& operator=(const InProcessFabric&) = delete;

  // Stage `stage`'s end, 0 <= stage < stages.
  Transport& ForStage(int stage);

  // Every waiting and later Send and Recv returns `why` (ABORTED when `why`
  // is OK). The first abort wins.
  void Abort(absl::Status why);

  // Called (with the fabric's lock held) each time a Recv finds its mailbox
  // empty and starts to wait: lets a test act while a receiver is blocked.
  // Set it before the fabric is used.
  void SetRecvWaitHookForTesting(std::function<void()> hook) { recv_waits_ = std::move(hook); }

 private:
  class StageTransport;
  struct Message {
    MessageTag tag;
    backend::Tensor tensor;
  };

  absl::Status Send(int from, int to, const MessageTag& tag, const backend::Tensor& tensor);
  absl::StatusOr<backend::Tensor> Recv(int from, int to, const MessageTag& tag);
  absl::Status CheckStage(int stage, const char* role) const;

  const int stages_;
  const absl::Duration recv_timeout_;
  std::vector<std::unique_ptr<StageTransport>> transports_;

  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<std::deque<Message>> mailboxes_;  // [from * stages + to], guarded by mu_
  absl::Status aborted_;                        // guarded by mu_
  std::function<void()> recv_waits_;
};

}  // namespace zo::pipeline

#endif  // ZO_WORKER_PIPELINE_IN_PROCESS_TRANSPORT_H_
