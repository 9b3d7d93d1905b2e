#include "server/param_group_layout.h"

#include <cstring>
#include <utility>

namespace zo {

ParamGroupLayout::ParamGroupLayout(const Config& config, const ShardMap& map, int server)
    : groups_(ParamGroupsOf(config)),
      adam_w_mode_(config.optimizer.type == OptimizerType::kAdamW ||
                   config.optimizer.params.adam_w_mode),
      bias_correction_(config.optimizer.params.bias_correction) {
  int64_t local = 0;
  for (int64_t c : map.ChunksOfServer(server)) {
    for (const TensorPiece& piece : map.PiecesOfChunk(c)) {
      const int group = map.tensors()[static_cast<size_t>(piece.tensor)].group;
      if (runs_.empty() || runs_.back().group != group) runs_.push_back({local, group});
      local += piece.length;
    }
  }
  if (runs_.empty()) runs_.push_back({0, 0});
}

AdamHyperParams ParamGroupLayout::HyperParams(int group, double lr,
                                              const ParamGroupConfig* step) const {
  const ParamGroupConfig& g = step != nullptr ? *step : groups_[static_cast<size_t>(group)];
  AdamHyperParams hp;
  hp.lr = lr;
  hp.beta1 = g.betas[0];
  hp.beta2 = g.betas[1];
  hp.eps = g.eps;
  hp.weight_decay = g.weight_decay;
  hp.adam_w_mode = adam_w_mode_;
  hp.bias_correction = bias_correction_;
  return hp;
}

RangedConstants<AdamStepConstants> ParamGroupLayout::StepConstants(
    absl::Span<const double> group_lr, absl::Span<const ParamGroupConfig> group_hyper,
    int64_t applied_steps, double grad_multiplier) const {
  std::vector<AdamStepConstants> by_group;
  by_group.reserve(groups_.size());
  for (int g = 0; g < num_groups(); ++g) {
    const auto at = static_cast<size_t>(g);
    const ParamGroupConfig* step = group_hyper.empty() ? nullptr : &group_hyper[at];
    by_group.push_back(
        MakeAdamStepConstants(HyperParams(g, group_lr[at], step), applied_steps, grad_multiplier));
  }
  std::vector<RangedConstants<AdamStepConstants>::Run> runs;
  for (const Run& r : runs_) {
    const AdamStepConstants& c = by_group[static_cast<size_t>(r.group)];
    // Plain floats, no padding: equal bytes are equal constants.
    if (!runs.empty() && std::memcmp(&runs.back().constants, &c, sizeof(c)) == 0) continue;
    runs.push_back({r.begin, c});
  }
  return RangedConstants<AdamStepConstants>(std::move(runs));
}

}  // namespace zo
