// Moves activations (forward) and their gradients (backward) between the
// stages of one pipeline. Implementations: in-process (stages as threads of
// one process, in_process_transport.h), TCP between processes
// (tcp_transport.h); NCCL in a later issue.
//
// Every (sender, receiver) direction is a FIFO. The schedules are
// deterministic, so both ends know which message comes next: Recv names the
// message it expects and fails with a clear status when another arrives
// (the two processes run different programs or different configs).
#ifndef ZO_WORKER_PIPELINE_TRANSPORT_H_
#define ZO_WORKER_PIPELINE_TRANSPORT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/backend/tensor.h"

namespace zo::pipeline {

struct MessageTag {
  enum class Kind : uint8_t { kActivation, kGrad };
  Kind kind = Kind::kActivation;
  int64_t step = 0;
  int micro_batch = 0;
  int chunk = 0;  // the receiving virtual stage's chunk

  friend bool operator==(const MessageTag&, const MessageTag&) = default;
};

// "activation(step=3, mb=1, chunk=0)".
std::string ToString(const MessageTag& tag);

class Transport {
 public:
  virtual ~Transport() = default;

  // Queues `tensor` for stage `to` and returns without waiting for the peer
  // to receive it. The caller must not modify the tensor afterwards (the
  // in-process transport hands over the same storage).
  virtual absl::Status Send(int to, const MessageTag& tag, const backend::Tensor& tensor) = 0;

  // Waits for the next message from stage `from`, which must carry `tag`.
  // FAILED_PRECONDITION naming both tags when another one arrives;
  // UNAVAILABLE naming the peer when it has gone away; DEADLINE_EXCEEDED
  // after the transport's receive timeout.
  virtual absl::StatusOr<backend::Tensor> Recv(int from, const MessageTag& tag) = 0;
};

}  // namespace zo::pipeline

#endif  // ZO_WORKER_PIPELINE_TRANSPORT_H_
