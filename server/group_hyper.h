// A parameter group's betas, eps and weight decay for one step, as a
// worker sends them (zo.client_lr: torch.optim's param_groups as a
// scheduler left them) and a commit and checkpoint carry them: the wire
// form (v1::GroupHyper) and the config's (ParamGroupConfig), both ways.
#ifndef ZO_SERVER_GROUP_HYPER_H_
#define ZO_SERVER_GROUP_HYPER_H_

#include "common/config.h"
#include "proto/zo/v1/coordination.pb.h"

namespace zo {

v1::GroupHyper GroupHyperProto(const ParamGroupConfig& g);
ParamGroupConfig GroupHyperOf(const v1::GroupHyper& g);

}  // namespace zo

#endif  // ZO_SERVER_GROUP_HYPER_H_
