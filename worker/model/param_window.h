// The layers whose weights are on the device while a stage streams its
// parameters (ZeRO-Infinity's parameter offload): the step's weights stay in
// host memory, a layer's are uploaded just before it computes (forward,
// recompute or backward), and the least recently used layers' are dropped
// to keep the weights on the device within a byte budget. A layer is the
// unit: its parameters come and go together.
//
// Not thread-safe: one per stage, used by the stage's executor thread.
#ifndef ZO_WORKER_MODEL_PARAM_WINDOW_H_
#define ZO_WORKER_MODEL_PARAM_WINDOW_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "worker/backend/backend.h"
#include "worker/model/layer.h"

namespace zo::model {

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
  // which holds the step before's weights.
  void Reset(std::map<const Param*, absl::Span<const std::byte>> host);
  // `layer`'s weights on the device: uploaded from the host copies unless
  // they are there, after dropping the least recently used other layers'
  // as the budget needs.
  absl::Status Fetch(Layer& layer);

  int64_t budget_bytes() const { return budget_bytes_; }
  int64_t resident_bytes() const { return resident_bytes_; }
  // The most resident at once since construction.
  int64_t peak_resident_bytes() const { return peak_resident_bytes_; }
  // Layers uploaded since construction.
  int64_t fetches() const { return fetches_; }

  ParamWindow(const ParamWindow&) = delete;
  ParamWindow& operator=(const ParamWindow&) = delete;

 private:
  void Drop(Layer* layer);

  backend::Backend& backend_;
  const DType dtype_;
  const int64_t budget_bytes_;
  std::map<const Param*, absl::Span<const std::byte>> host_;
  std::list<Layer*> resident_;  // least recently used first
  int64_t resident_bytes_ = 0;
  int64_t peak_resident_bytes_ = 0;
  int64_t fetches_ = 0;
};

}  // namespace zo::model

#endif  // ZO_WORKER_MODEL_PARAM_WINDOW_H_
