// The layers whose weights are on the device while a stage streams its
// parameters (ZeRO-Infinity's parameter offload): the step's weights stay in
// host memory, a layer's are uploaded just before it computes (forward,
// recompute or backward), and other layers' are dropped to keep the weights
// on the device within a byte budget. A layer is the unit: its parameters
// come and go together.
//
// Which layer is dropped: a step's schedule fetches the layers in the same
// order every step, so the window records the order of one step and, while
// the next follows it, drops the layer whose next use is furthest ahead
// (Belady's rule, the fewest uploads for that order: under GPipe's
// repeated forward sweeps the least recently used layer is the very next
// one needed). The first step, and a step that strays from the recorded
// order, drop the least recently used.
//
// While a layer computes, the window prefetches the layer fetched next (the
// recorded order's, else the stage's guess): its upload runs beside the
// compute (Backend::UploadAsync: the copy engine of a GPU) if the budget
// holds it beside the layer in use, and its Fetch waits for it. One
// prefetch is in flight at a time.
//
// The step's weights may also live in a file (offload_param "nvme"): the
// window then reads a layer's into one of two staging slots just before its
// upload, slot 0 for Fetch (whose upload it waits for) and slot 1 for the
// prefetch (free again once Settle returns). The prefetch's read runs on a
// thread of the window's, beside the compute, and its uploads start there;
// the window never has two reads in flight.
//
// Not thread-safe: one per stage, used by the stage's executor thread.
#ifndef ZO_WORKER_MODEL_PARAM_WINDOW_H_
#define ZO_WORKER_MODEL_PARAM_WINDOW_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/wake_queue.h"
#include "worker/backend/backend.h"
#include "worker/model/layer.h"

namespace zo::model {

// Reads the step's weights of `params` into staging slot `slot` (0 or 1)
// and returns their bytes there, one span per param in the dtype; the spans
// stay valid until the next read into that slot.
using HostWeightReader = std::function<absl::StatusOr<std::vector<absl::Span<const std::byte>>>(
    absl::Span<const Param* const> params, int slot)>;

class ParamWindow {
 public:
  // Weights in `dtype`, at most `budget_bytes` of them on `backend` at once.
  ParamWindow(backend::Backend& backend, DType dtype, int64_t budget_bytes);

  // Bytes of `layer`'s weights on the device.
  static int64_t LayerBytes(const Layer& layer, DType dtype);
  // INVALID_ARGUMENT naming the layer when one layer's weights alone exceed
  // the budget.
  absl::Status CheckFits(absl::Span<const Layer* const> layers) const;

  // The weights of a new step: each param's bytes (in the dtype) on the
  // host, valid until the next Reset. Drops every layer's device copy,
  // which holds the step before's weights, unless `unchanged` says these
  // are the same bytes at the same places as the step before's.
  void Reset(std::map<const Param*, absl::Span<const std::byte>> host, bool unchanged = false);
  // The same for weights read on demand; `unchanged` says the reader gives
  // the step before's bytes.
  void Reset(HostWeightReader read, bool unchanged = false);
  // `layer`'s weights on the device: uploaded from the host copies unless
  // they are there, after dropping other layers' as the budget needs (see
  // above for which). Waits for a prefetch in flight first; its failure is
  // returned here.
  absl::Status Fetch(Layer& layer);
  // Starts uploading the weights of the layer fetched next unless they are
  // on the device or on their way, dropping layers other than `in_use`;
  // nothing when the two together exceed the budget. The layer fetched
  // next is the recorded order's while the step follows it (across
  // micro-batches and chunks too), else `hint` (null: none).
  absl::Status Prefetch(Layer* hint, const Layer& in_use);
  // Waits for the prefetch in flight (its failure drops its layer and is
  // returned): before the host copies change.
  absl::Status Settle();

  int64_t budget_bytes() const { return budget_bytes_; }
  int64_t resident_bytes() const { return resident_bytes_; }
  // The most resident at once since construction.
  int64_t peak_resident_bytes() const { return peak_resident_bytes_; }
  // Layers uploaded since construction, and how many of them ahead of
  // their use (Prefetch).
  int64_t fetches() const { return fetches_; }
  int64_t prefetches() const { return prefetches_; }

  // Waits for a prefetch in flight: its host bytes must outlive the copy.
  ~ParamWindow();
  ParamWindow(const ParamWindow&) = delete;
  ParamWindow& operator=(const ParamWindow&) = delete;

 private:
  // One layer's uploads in flight; the copies' callbacks share it.
  struct InFlight {
    Layer* layer = nullptr;
    std::mutex mu;
    std::condition_variable done;
    int outstanding = 0;  // guarded by mu
    absl::Status status;  // the first failure; guarded by mu
  };

  bool IsResident(const Layer& layer) const;
  // Notes a fetch of `layer` in the step's order of fetches.
  void Record(Layer& layer);
  // The resident layer to drop for room, never `keep`; null when only
  // `keep` is resident.
  Layer* Victim(const Layer* keep) const;
  // Keeps the device copies only when `keep`; starts the step's order.
  void BeginStep(bool keep);
  // The host bytes of each of `layer`'s params (read into `slot` when they
  // are in a file); INTERNAL when one is missing.
  absl::StatusOr<std::vector<absl::Span<const std::byte>>> HostCopies(const Layer& layer,
                                                                      int slot) const;
  void Drop(Layer* layer);
  // `parts` of `flight`'s outstanding work ended, with `status`.
  static void FinishPart(InFlight& flight, absl::Status status, int parts);

  backend::Backend& backend_;
  const DType dtype_;
  const int64_t budget_bytes_;
  std::map<const Param*, absl::Span<const std::byte>> host_;
  HostWeightReader read_;       // instead of host_ when set
  std::list<Layer*> resident_;  // least recently used first
  int64_t resident_bytes_ = 0;
  int64_t peak_resident_bytes_ = 0;
  int64_t fetches_ = 0;
  int64_t prefetches_ = 0;
  std::shared_ptr<InFlight> in_flight_;  // null when no prefetch is
  std::unique_ptr<WakeQueue> reader_;    // reads prefetched layers from a file

  // The order of fetches of the last whole step, and for each position the
  // next position of the same layer (SIZE_MAX: none).
  std::vector<Layer*> order_;
  std::vector<size_t> next_same_;
  std::vector<Layer*> this_step_;  // this step's fetches so far
  bool following_ = false;         // this step has kept to order_
  // While following: each layer's next position in order_ after the last
  // fetch (a layer not in it is used no more this step).
  std::map<const Layer*, size_t> next_use_;
};

}  // namespace zo::model

#endif  // ZO_WORKER_MODEL_PARAM_WINDOW_H_
