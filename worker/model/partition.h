// Cutting a model's layers into pipeline stages, with the methods of
// DeepSpeed's PipelineModule(partition_method=...):
//   "parameters"  balance the parameter counts (the default),
//   "uniform"     balance the layer counts,
//   "type:REGEX"  balance the number of layers whose type matches REGEX
//                 (case-insensitive, e.g. "type:block").
// Balanced means: contiguous, non-empty parts that minimise the heaviest
// part's weight.
#ifndef ZO_WORKER_MODEL_PARTITION_H_
#define ZO_WORKER_MODEL_PARTITION_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace zo::model {

struct LayerWeightInfo {
  std::string type;
  int64_t param_count = 0;
};

// Returns parts + 1 boundaries: part i holds layers [b[i], b[i+1]).
// INVALID_ARGUMENT for an unknown method, a bad regex, a regex matching no
// layer, or more parts than layers.
absl::StatusOr<std::vector<int>> PartitionLayers(const std::vector<LayerWeightInfo>& layers,
                                                 int parts, const std::string& method);

// The boundaries of the layer list cut into `parts` contiguous non-empty
// ranges minimising the largest sum of `weights`; among optimal cuts, each
// part takes as many layers as it can (earlier parts first). Exposed for tests.
std::vector<int> BalancedBoundaries(const std::vector<int64_t>& weights, int parts);

}  // namespace zo::model

#endif  // ZO_WORKER_MODEL_PARTITION_H_
