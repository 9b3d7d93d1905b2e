#include "server/group_hyper.h"

namespace zo {

v1::GroupHyper GroupHyperProto(const ParamGroupConfig& g) {
  v1::GroupHyper out;
  out.set_beta1(g.betas[0]);
  out.set_beta2(g.betas[1]);
  out.set_eps(g.eps);
  out.set_weight_decay(g.weight_decay);
  return out;
}

ParamGroupConfig GroupHyperOf(const v1::GroupHyper& g) {
  return {.betas = {g.beta1(), g.beta2()}, .eps = g.eps(), .weight_decay = g.weight_decay()};
}

}  // namespace zo
