// Conversions between zo's types and their wire form (proto/zo/v1/tensor.proto)
// that the client needs. The worker may not include server/, so it keeps its
// own copy of these few lines.
#ifndef ZO_WORKER_CLIENT_INTERNAL_PROTO_CONVERT_H_
#define ZO_WORKER_CLIENT_INTERNAL_PROTO_CONVERT_H_

#include <optional>
#include <vector>

#include "common/dtype.h"
#include "common/sharding.h"
#include "proto/zo/v1/tensor.pb.h"

namespace zo::client_internal {

v1::DType ToProto(DType dtype);
// nullopt for DTYPE_UNSPECIFIED and values this build does not know.
std::optional<DType> FromProto(v1::DType dtype);

v1::Manifest ToProto(const std::vector<TensorSpec>& tensors);

}  // namespace zo::client_internal

#endif  // ZO_WORKER_CLIENT_INTERNAL_PROTO_CONVERT_H_
