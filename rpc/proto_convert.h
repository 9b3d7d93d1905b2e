// Conversions between zo's types (common/) and their wire form
// (proto/zo/v1/tensor.proto, params.proto), for both ends of the protocol.
#ifndef ZO_RPC_PROTO_CONVERT_H_
#define ZO_RPC_PROTO_CONVERT_H_

#include <vector>

#include "absl/status/statusor.h"
#include "common/dpu_compensation.h"
#include "common/dtype.h"
#include "common/sharding.h"
#include "proto/zo/v1/params.pb.h"
#include "proto/zo/v1/tensor.pb.h"

namespace zo {

v1::DType DTypeToProto(DType dtype);
// INVALID_ARGUMENT naming the number for DTYPE_UNSPECIFIED and values this
// build does not know.
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype);

// Name, shape and dtype of every tensor, in order.
v1::Manifest ManifestToProto(const std::vector<TensorSpec>& tensors);

// One server's DPU compensation terms of one tensor part.
void CompensationTermsToProto(const CompensationTerms& terms, v1::TensorCompensation* out);
CompensationTerms CompensationTermsFromProto(const v1::TensorCompensation& p);

}  // namespace zo

#endif  // ZO_RPC_PROTO_CONVERT_H_
