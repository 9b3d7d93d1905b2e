// A stage's ParamLink to the offload servers.
//
// Weights: each step's are pulled (the client's DPU policy says which
// version) into page-locked host memory and copied into a second, idle set
// of device tensors while the step before still computes; the step boundary
// swaps the two sets. The prefetch of step s + 1 starts with step s: its
// pull waits for the version step s's gradients make (on the in-process
// route the servers' update, a speculative one as it goes, writes straight
// into it); with DPU that version is the one before, which the servers
// are applying, so the update, the pull and the upload all overlap step s.
// The step boundary waits for the pull's first batch only: the rest of the
// pull and the uploads, in layer order, go on while the first layers
// compute (AwaitWeights holds a layer until its own weights are there),
// except with the DPU compensation, which combines whole versions. On the
// in-process route the pull is cut into batches that the servers answer
// as soon as they wrote them, so the next step's first layers compute
// while its last ones are still being updated; elsewhere it is one batch.
//
// Streaming (LoadHostWeights, zero_optimization.offload_param): the stage's
// window uploads the weights layer by layer; there is no device set and no
// prefetch (the step's pull ends before its first layer computes). Where
// they are kept is StreamedWeights' (streamed_weights.h): nowhere when the
// servers share this host (the window pulls each layer from theirs), a
// host copy, or a file (KeepStreamedWeightsInFile).
//
// Gradients: each final gradient is cast to the job's dtype and copied
// (Backend::DownloadAsync: on a GPU, beside the compute, into page-locked
// memory) into a staging slot that the client's push sends without a copy.
// The backward goes on while gradients travel; FinishStep waits for them.
// Each parameter has a fixed place in each slot; a place is free again once
// the client has written its bytes. One slot when a step pushes its summed
// gradients once; two when every micro-batch pushes its own
// (zo.gradient_accumulation "servers"): micro-batch m then waits, per
// parameter, for m - 2's bytes to be on the wire, which bounds the staging
// memory whatever the number of micro-batches. A streaming stage, whose
// gradients leave as the backward makes them, takes them from a ring of a
// few layers' worth instead (staging_ring.h), not a copy of the stage.
#ifndef ZO_WORKER_TRAIN_OFFLOAD_LINK_H_
#define ZO_WORKER_TRAIN_OFFLOAD_LINK_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/memory_estimate.h"
#include "worker/backend/backend.h"
#include "worker/client/offload_client.h"
#include "worker/model/model_stage.h"
#include "worker/train/staging_ring.h"
#include "worker/train/step_abort.h"
#include "worker/train/streamed_weights.h"

namespace zo::train {

class OffloadLink final : public model::ParamLink {
 public:
  // `manifest` is the job's (model.Manifest(dtype)); parameters are found in
  // it by name.
  OffloadLink(OffloadClient* client, backend::Backend& backend,
              const std::vector<TensorSpec>& manifest, DType dtype);
  // Gives up a prefetch in flight and waits for the copies still in flight
  // (a step that failed half way).
  ~OffloadLink() override;

  // A restarted worker swaps its resend client for a plain one after the
  // first step (waits for a prefetch that uses the old one).
  void set_client(OffloadClient* client);
  // Prefetches register with `abort` (worker/train/step_abort.h): tripped,
  // it cancels the one in flight, and the step fails with its reason.
  void set_step_abort(std::shared_ptr<StepAbort> abort) { abort_ = std::move(abort); }

  // Sets the initial weights of `params` on the servers when the job is at
  // version 0 (a fresh job); a no-op for a job that has trained.
  absl::Status InitializeIfFresh(absl::Span<model::Param* const> params, uint64_t seed);

  // zo.dpu.compensation "worker": each delayed step computes on the version
  // it pulled moved by the step before's update (common/dpu_compensation.h:
  // the servers' coefficients, the last two versions pulled, and that
  // step's gradients, still in each param.grad when LoadWeights runs).
  // Keeps two more device copies of the stage's weights. Before the first
  // LoadWeights; not with streaming.
  void CompensateDelayedSteps() { compensate_ = true; }

  // Streaming keeps the pulled weights in a file (offload_param "nvme";
  // streamed_weights.h). Before the first LoadHostWeights.
  void KeepStreamedWeightsInFile(WeightFileOptions options) { file_options_ = std::move(options); }
  // Where streaming keeps the step's weights (StreamedWeights::KindFor this
  // link's routes and file).
  StreamedWeights::Kind streamed_kind() const;
  // Host memory the link holds for weights and gradients (page-locked where
  // the backend has it): the weights' copy, or what streaming keeps, and the
  // gradient staging. Not while the window reads.
  int64_t host_bytes() const;

  absl::Status LoadWeights(int64_t step, absl::Span<model::Param* const> params) override;
  absl::Status AwaitWeights(absl::Span<model::Param* const> first) override;
  absl::StatusOr<model::HostWeights> LoadHostWeights(
      int64_t step, absl::Span<model::Param* const> params) override;
  double LossScale(int64_t step) override;
  absl::Status PushGradient(int64_t step, const model::Param& param, int micro_batch) override;
  absl::Status FinishStep(int64_t step) override;

 private:
  absl::StatusOr<int> TensorIndex(const std::string& name) const;
  // First LoadWeights or LoadHostWeights: the manifest indices, host
  // buffers and (not streaming) idle tensors. InternalError when a later
  // call brings other params.
  absl::Status Prepare(absl::Span<model::Param* const> params, bool streaming);
  // Points host_ at the client's region (RegionPullBuffers) or at a new
  // arena.
  void PlaceHostWeights();
  // Whether PushGradient asks the client for the place where its server
  // reads a gradient (OffloadClient::PushBuffers).
  bool MayLendGradientPlaces();
  // Pulls `step`'s weights into host_ now; whether they changed.
  absl::StatusOr<bool> PullNow(int64_t step);
  // Runs `pull` with a cancellation registered with abort_: a neighbour
  // that dies leaves a pull waiting for a version the servers cannot reach
  // without it. The abort's reason when it was tripped.
  absl::StatusOr<bool> Guarded(const std::function<absl::StatusOr<bool>(PullCancellation*)>& pull);
  // PullNow, then uploads them into the params; whether it did (false: the
  // params already held that version).
  absl::StatusOr<bool> LoadNow(int64_t step);
  // With compensate_, once the params hold `step`'s version as pulled
  // (`fresh`: just put there; else they hold what the last step left):
  // keeps it raw, and for a delayed step moves the params by the step
  // before's update.
  absl::Status Compensate(int64_t step, bool fresh);
  // Starts the prefetch of `step` when none runs, the step before's
  // uploads are all there, and its version's gradients are pushed, or are
  // the ones the step now running pushes (a step that fails cancels it:
  // LoadWeights of any other step does), and returns once its pulls are
  // registered with the servers.
  void MaybePrefetch(int64_t step);
  // Where the prefetch's pull of the stage's weights is cut into batches
  // (ends of ranges of params_, in order): one batch unless every route is
  // the in-process one, which answers a batch once the servers wrote it.
  std::vector<size_t> PullBatchEnds(OffloadClient& client) const;
  static constexpr size_t kPullBatches = 16;
  // Waits for the prefetch thread and for every upload it queued; their
  // outcome stays in prefetch_* and arrivals_.
  void JoinPrefetch();
  // Ends the prefetch's pull and waits for its thread: for a prefetch whose
  // step will not run next, which may wait on a version only this worker's
  // own pushes would make.
  void CancelPrefetch();
  // A step whose uploads were not all awaited (it failed): waits for them,
  // and has the next load upload the host copy whole.
  void DropArrivals();
  // Waits until params [0, end) are uploaded, or an upload failed (its
  // error unless those params are there).
  absl::Status WaitArrivals(size_t end);

  OffloadClient* client_;
  backend::Backend& backend_;
  DType dtype_;
  std::map<std::string, int> index_;
  std::vector<model::Param*> params_;
  bool streaming_ = false;  // LoadHostWeights: no device set, no prefetch
  std::vector<int> pulled_tensors_;
  // The pulled weights: in the same-host route's region
  // (OffloadClient::RegionPullBuffers), or else back to back in this arena,
  // page-locked where the backend has it.
  std::shared_ptr<std::byte> host_arena_;
  std::vector<absl::Span<std::byte>> host_;  // empty when streaming
  std::optional<WeightFileOptions> file_options_;
  std::unique_ptr<StreamedWeights> streamed_;  // from the first LoadHostWeights
  // The second set of weight tensors: the prefetch uploads into it.
  std::vector<backend::Tensor> idle_;
  // With compensate_: the last two versions pulled, as pulled, and their
  // versions (-1: none); the params hold weights computed from them.
  bool compensate_ = false;
  bool said_gradients_in_place_ = false;  // logged once
  // Whether the client may lend gradient places (MayLendGradientPlaces), as
  // found for lend_checked_for_.
  const OffloadClient* lend_checked_for_ = nullptr;
  bool may_lend_ = false;
  std::vector<backend::Tensor> served_, served_before_;
  int64_t served_version_ = -1, served_before_version_ = -1;
  bool params_moved_ = false;  // the params hold other weights than served_
  // host_ holds weights the params do not: nothing uploaded yet, or a
  // prefetch dropped or failed.
  bool host_ahead_ = true;
  double loss_scale_ = 1;  // of the step LoadWeights last loaded
  // The last step whose gradients are all acknowledged (a prefetch reads it).
  std::atomic<int64_t> pushed_{-1};

  std::thread prefetch_;
  int64_t prefetch_step_ = -1;                         // the step prefetch_ fetches for; -1: none
  std::unique_ptr<PullCancellation> prefetch_cancel_;  // of the prefetch in flight
  std::shared_ptr<StepAbort> abort_;                   // may be null
  // Written by prefetch_, read after joining it or seeing arrivals_->pulled.
  absl::Status prefetch_status_;
  bool prefetch_changed_ = false;
  double prefetch_loss_scale_ = 1;
  // The prefetch's uploads into idle_, one per param in order, after its
  // pull. Shared with their completions, which a device may run later.
  struct Arrivals {
    std::mutex mu;
    std::condition_variable changed;
    // The pull's first batch came, or the pull ended before it (failed or
    // unchanged): prefetch_* hold its outcome.
    bool pulled = false;
    // Its pulls are registered with the servers (or the pull ended).
    bool registered = false;
    size_t uploads = 0;   // queued so far (0: nothing to upload)
    size_t finished = 0;  // completions so far, in any order
    std::vector<char> done;
    size_t ready = 0;                      // params [0, ready) are uploaded
    absl::Status error;                    // the first failed upload or later batch
    std::vector<backend::Tensor> targets;  // idle_ when the prefetch began
  };
  std::shared_ptr<Arrivals> arrivals_;  // of the prefetch in flight or last
  // LoadWeights handed over params whose uploads may still be arriving.
  bool arriving_ = false;
  int64_t loaded_step_ = -1;  // the step LoadWeights last loaded

  // The gradient staging (Backend::AllocateHost) and which of its places
  // hold bytes the client has not written yet. Shared with the owners handed
  // to the client, which free a place when the client lets go of it.
  struct Staging {
    std::shared_ptr<std::byte> arena;
    std::mutex mu;
    std::condition_variable freed;
    std::vector<char> busy;  // [slot * params + local index]; guarded by mu
  };
  std::shared_ptr<Staging> staging_;  // not streaming
  // Streaming: gradients through a ring of kStreamingGradientRingBytes
  // (common/memory_estimate.h), twice the largest, or the places' bytes.
  std::shared_ptr<StagingRing> ring_;
  int slots_ = 1;
  size_t slot_bytes_ = 0;
  // Manifest index -> (local index, byte offset in a slot).
  std::map<int, std::pair<int, size_t>> places_;

  std::mutex mu_;
  std::condition_variable copied_;
  int copies_in_flight_ = 0;  // guarded by mu_
  absl::Status copy_error_;   // the first failed copy or push; guarded by mu_
};

}  // namespace zo::train

#endif  // ZO_WORKER_TRAIN_OFFLOAD_LINK_H_
