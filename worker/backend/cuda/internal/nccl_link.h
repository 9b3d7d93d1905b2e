// The CUDA backend's DeviceLinks (worker/backend/device_link.h) over NCCL.
// A link is two two-rank communicators, one per direction, so that each
// side's sends never queue behind its receives (a send blocks on the device
// until the peer's receive runs: with one stream for both, two stages
// sending to each other at once would wait for each other for ever). Sends
// run on a stream of their own after the compute stream's queued work;
// a receive allocates on its stream, receives and waits for that alone.
// NCCL itself is loaded at run time (dlopen of libnccl.so.2).
#ifndef ZO_WORKER_BACKEND_CUDA_INTERNAL_NCCL_LINK_H_
#define ZO_WORKER_BACKEND_CUDA_INTERNAL_NCCL_LINK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/backend/device_link.h"

namespace zo::backend::cuda {

struct DeviceContext;

class NcclLinks final : public DeviceLinks {
 public:
  explicit NcclLinks(std::shared_ptr<DeviceContext> context) : context_(std::move(context)) {}

  // Whether libnccl.so.2 could be loaded (tried once per process).
  static bool Available();

  absl::StatusOr<std::string> Offer() override;
  absl::StatusOr<std::unique_ptr<DeviceLink>> Join(absl::string_view offer, int rank) override;

 private:
  std::shared_ptr<DeviceContext> context_;
};

}  // namespace zo::backend::cuda

#endif  // ZO_WORKER_BACKEND_CUDA_INTERNAL_NCCL_LINK_H_
