// Parameter groups over one server's optimizer state (torch.optim's
// param_groups: their own betas, eps, weight decay and, with zo.client_lr,
// learning rate): which group each local element belongs to, and the Adam
// constants a step gives each. The server's state is its chunks
// (ShardMap::ChunksOfServer) concatenated in order; a group's elements are
// those of the manifest tensors that name it (TensorSpec::group).
//
// Immutable after construction; safe to share between threads.
#ifndef ZO_SERVER_PARAM_GROUP_LAYOUT_H_
#define ZO_SERVER_PARAM_GROUP_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/config.h"
#include "common/sharding.h"
#include "offload/optimizer_kernels.h"
#include "offload/ranged_constants.h"

namespace zo {

class ParamGroupLayout {
 public:
  // `config` and `map` are read here only.
  ParamGroupLayout(const Config& config, const ShardMap& map, int server);

  int num_groups() const { return static_cast<int>(groups_.size()); }

  // Adam's hyper-parameters of group `group` at learning rate `lr`, with
  // the group's own betas, eps and weight decay, or `step`'s where given.
  AdamHyperParams HyperParams(int group, double lr, const ParamGroupConfig* step = nullptr) const;

  // The constants of a step for every local element: group g at rate
  // group_lr[g] (one rate per group) with group_hyper[g]'s betas, eps and
  // weight decay (empty: the groups' own), Adam's step count
  // `applied_steps`, gradients times `grad_multiplier`. Adjacent elements
  // of groups whose constants are equal share a run.
  RangedConstants<AdamStepConstants> StepConstants(absl::Span<const double> group_lr,
                                                   absl::Span<const ParamGroupConfig> group_hyper,
                                                   int64_t applied_steps,
                                                   double grad_multiplier) const;

 private:
  struct Run {
    int64_t begin = 0;  // local element
    int group = 0;
  };

  const std::vector<ParamGroupConfig> groups_;
  const bool adam_w_mode_;
  const bool bias_correction_;
  std::vector<Run> runs_;  // ascending, adjacent runs in different groups
};

}  // namespace zo

#endif  // ZO_SERVER_PARAM_GROUP_LAYOUT_H_
