// A stage's ParamLink to the offload servers: weights pulled with the
// client's DPU policy, each final gradient cast to the job's dtype and
// copied (Backend::DownloadAsync: on a GPU, beside the compute, into
// page-locked memory) into a staging arena that the client's push sends
// without a copy. The backward goes on while gradients travel; FinishStep
// waits for them.
#ifndef ZO_WORKER_TRAIN_OFFLOAD_LINK_H_
#define ZO_WORKER_TRAIN_OFFLOAD_LINK_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/backend/backend.h"
#include "worker/client/offload_client.h"
#include "worker/model/model_stage.h"

namespace zo::train {

class OffloadLink final : public model::ParamLink {
 public:
  // `manifest` is the job's (model.Manifest(dtype)); parameters are found in
  // it by name.
  OffloadLink(OffloadClient* client, backend::Backend& backend,
              const std::vector<TensorSpec>& manifest, DType dtype);
  // Waits for the copies still in flight (a step that failed half way).
  ~OffloadLink() override;

  // A restarted worker swaps its resend client for a plain one after the
  // first step.
  void set_client(OffloadClient* client) { client_ = client; }

  // Sets the initial weights of `params` on the servers when the job is at
  // version 0 (a fresh job); a no-op for a job that has trained.
  absl::Status InitializeIfFresh(absl::Span<model::Param* const> params, uint64_t seed);

  absl::Status LoadWeights(int64_t step, absl::Span<model::Param* const> params) override;
  double LossScale(int64_t step) override;
  absl::Status PushGradient(int64_t step, const model::Param& param) override;
  absl::Status FinishStep(int64_t step) override;

 private:
  absl::StatusOr<int> TensorIndex(const std::string& name) const;

  OffloadClient* client_;
  backend::Backend& backend_;
  DType dtype_;
  std::map<std::string, int> index_;
  // Host copies of the pulled weights: PullForStep skips a version it
  // already delivered into them.
  std::vector<std::vector<std::byte>> weights_;
  std::vector<int> pulled_tensors_;
  bool uploaded_ = false;  // the params hold weights_

  // One step's gradients in the job's dtype, back to back (Backend::
  // AllocateHost). A step reuses it from the start: FinishStep of the step
  // before has returned, so every byte of it was written to the servers.
  std::shared_ptr<std::byte> arena_;
  size_t arena_bytes_ = 0;
  size_t arena_used_ = 0;
  int64_t arena_step_ = -1;

  std::mutex mu_;
  std::condition_variable copied_;
  int copies_in_flight_ = 0;  // guarded by mu_
  absl::Status copy_error_;   // the first failed copy or push; guarded by mu_
};

}  // namespace zo::train

#endif  // ZO_WORKER_TRAIN_OFFLOAD_LINK_H_
